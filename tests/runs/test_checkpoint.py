"""Checkpoint files: RNG round trip, atomic writes, the safe loader, exported encoders, and the
import of the authors' (BayesNCL / NCL, solo-learn Lightning) checkpoint layout."""

from __future__ import annotations

import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from torch import nn

from bayesncl.app.cli import main
from bayesncl.app.evaluate import load_trained
from bayesncl.app.train import pretrain
from bayesncl.config import ConfigError, build_config
from bayesncl.core.model import build_model
from bayesncl.metrics.inputs import EvalError
from bayesncl.runs.export import export_encoder
from bayesncl.runs.features import load_features
from bayesncl.runs.logs import LOG_FIELDS, write_log
from bayesncl.runs.messages import RunDirError, describe_config_diff
from bayesncl.runs.official import infer_official_config, load_official_checkpoint, official_state_dict
from bayesncl.runs.rundir import prepare_run_dir
from bayesncl.runs.safe_load import CheckpointError, load_checkpoint_file
from bayesncl.runs.state import atomic_save, rng_state, set_rng_state

from ..conftest import TINY


def one_line_error(err: str) -> str:
    err = err.strip()
    assert err.startswith("bayesncl: error:"), err
    assert "\n" not in err and "Traceback" not in err, err
    return err


# ----------------------------------------------------------------------------- RNG and atomic writes
def test_rng_state_round_trip_through_a_safe_checkpoint(tmp_path: Path) -> None:
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    atomic_save({"rng": rng_state()}, tmp_path / "rng.pt")
    want = (random.random(), np.random.rand(3).tolist(), torch.rand(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    set_rng_state(load_checkpoint_file(tmp_path / "rng.pt")["rng"])  # weights_only=True
    got = (random.random(), np.random.rand(3).tolist(), torch.rand(3))
    assert got[0] == want[0] and got[1] == want[1] and torch.equal(got[2], want[2])


def test_atomic_save_replaces_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    atomic_save({"a": torch.zeros(2)}, path)
    atomic_save({"a": torch.ones(2)}, path)
    assert torch.equal(load_checkpoint_file(path)["a"], torch.ones(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_config_diff_names_old_and_new_values() -> None:
    old = build_config(overrides=[*TINY, "method.rho=0.8"])
    new = build_config(overrides=[*TINY, "method.rho=0.5", "data.name=cifar10", "train.epochs=9"])
    assert describe_config_diff(old, new) == "data.name: 'synthetic' -> 'cifar10'; method.rho: 0.8 -> 0.5"


def test_read_only_file_system_is_caught_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """os.access says yes to root even on a read-only mount; the write probe does not."""
    import errno
    import tempfile

    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    with pytest.raises(RunDirError) as info:
        prepare_run_dir(tmp_path / "run", build_config(overrides=TINY), resume=False, overwrite=False)
    run = tmp_path / "run"
    assert str(info.value) == f"run dir {run} is not writable (Read-only file system: {tmp_path})"
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- the safe loader
class _Payload:
    """Unpickling this object creates ``self.marker``: proof that a loader ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204 - pickle protocol
        return (open, (str(self.marker), "w"))


def _crafted_files(tmp_path: Path, marker: Path) -> dict[str, Path]:
    files = {"torch.save zip": tmp_path / "evil.pt", "raw pickle p2": tmp_path / "evil.pkl"}
    torch.save({"format": "bayesncl-checkpoint-v1", "state_dict": _Payload(marker)}, files["torch.save zip"])
    with files["raw pickle p2"].open("wb") as f:
        pickle.dump({"state_dict": _Payload(marker)}, f, protocol=2)
    return files


def test_the_crafted_pickle_really_runs_code_when_loaded_unsafely(tmp_path: Path) -> None:
    live = tmp_path / "live-marker"
    with (tmp_path / "live.pkl").open("wb") as f:
        pickle.dump(_Payload(live), f)
    with (tmp_path / "live.pkl").open("rb") as f:
        pickle.load(f).close()  # the unsafe way: the payload runs
    assert live.exists()


@pytest.mark.parametrize("kind", ["torch.save zip", "raw pickle p2"])
def test_crafted_pickle_is_refused_without_running_it(tmp_path: Path, kind: str) -> None:
    marker = tmp_path / "MARKER"
    path = _crafted_files(tmp_path, marker)[kind]
    with pytest.raises(CheckpointError) as info:
        load_checkpoint_file(path)
    msg = str(info.value)
    assert "\n" not in msg and "refused by the safe loader" in msg and "nothing in it was run" in msg
    assert "io.open" in msg or "builtins.open" in msg
    assert not marker.exists()


@pytest.mark.parametrize("command", ["extract", "evaluate"])
def test_crafted_pickle_is_refused_by_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    marker = tmp_path / "MARKER"
    path = _crafted_files(tmp_path, marker)["torch.save zip"]
    assert main([command, str(path)]) == 2
    err = one_line_error(capsys.readouterr().err)
    assert f"{path} was refused by the safe loader" in err
    assert not marker.exists()


@pytest.mark.slow
def test_crafted_last_pt_is_refused_on_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main(["pretrain", "--run-dir", str(run), *TINY, "--no-eval"]) == 0
    marker = tmp_path / "MARKER"
    torch.save({"format": "bayesncl-checkpoint-v1", "config": _Payload(marker)}, run / "last.pt")
    capsys.readouterr()
    assert main(["pretrain", "--run-dir", str(run), "--resume"]) == 2
    err = one_line_error(capsys.readouterr().err)
    assert "--resume:" in err and "refused by the safe loader" in err
    assert not marker.exists()


def test_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "notes.pt").write_text("hello world\n")
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "cut.pt").write_bytes(_zip_bytes(tmp_path)[:200])
    cases = {
        "notes.pt": "is not a PyTorch checkpoint: neither a torch.save zip archive nor a pickle",
        "empty.pt": "is empty, not a checkpoint",
        "cut.pt": "is not a readable PyTorch checkpoint (truncated or damaged?",
        "missing.pt": "no such file",
    }
    for name, expected in cases.items():
        with pytest.raises(CheckpointError, match=r"^[^\n]*$") as info:
            load_checkpoint_file(tmp_path / name)
        assert expected in str(info.value), (name, str(info.value))


def _zip_bytes(tmp_path: Path) -> bytes:
    torch.save({"x": torch.arange(100)}, tmp_path / "ok.pt")
    return (tmp_path / "ok.pt").read_bytes()


# ----------------------------------------------------------------------------- exported encoder
def _resnet_cfg(stem: str) -> list[str]:
    # fp32: the test is about the export's layout; this 16-px ResNet-18 at lr 0.4 once diverged in bf16
    # after the benchmark tests had changed torch's thread count (the full suite, on an AVX512-BF16 CPU)
    return [*TINY, "model.backbone=resnet18", f"model.cifar_stem={stem}", "model.proj_hidden=64",
            "train.precision=fp32"]


@pytest.mark.slow
def test_exported_resnet_loads_into_torchvision_resnet18(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = build_config(overrides=_resnet_cfg("false"))
    pretrain(cfg, run, evaluate=False)
    sd = torch.load(run / "backbone_torchvision.pt", weights_only=True)

    net = torchvision.models.resnet18()  # the documented way 1: keep fc, strict=False
    result = net.load_state_dict(sd, strict=False)
    assert sorted(result.missing_keys) == ["fc.bias", "fc.weight"] and result.unexpected_keys == []

    net = torchvision.models.resnet18()  # the documented way 2: fc = Identity, strict
    net.fc = nn.Identity()
    net.load_state_dict(sd)
    model, _, _ = load_trained(run, device=torch.device("cpu"))
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(net.eval()(x), model.backbone(x))


@pytest.mark.slow
def test_exported_cifar_stem_resnet_loads_after_the_same_stem_swap(tmp_path: Path) -> None:
    cfg = build_config(overrides=_resnet_cfg("true"))
    model = build_model(cfg, 3, 16, 10).eval()
    export_encoder(model, tmp_path)
    sd = torch.load(tmp_path / "backbone_torchvision.pt", weights_only=True)
    net = torchvision.models.resnet18()
    pad = cfg.model.stem_padding  # 2, the authors' (issue 13 item 2; was 1)
    net.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=pad, bias=False)
    net.maxpool = nn.Identity()
    net.fc = nn.Identity()
    net.load_state_dict(sd)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(net.eval()(x), model.backbone(x))


@pytest.mark.slow
def test_encoder_safetensors_reloads_the_same_model(tmp_path: Path) -> None:
    run = tmp_path / "run"
    pretrain(build_config(overrides=[*TINY, "method.name=bayesncl"]), run, evaluate=False)
    from safetensors.torch import load_file

    tensors = load_file(str(run / "encoder.safetensors"))
    a, _, _ = load_trained(run, device=torch.device("cpu"))
    b, cfg, _ = load_trained(run / "encoder.safetensors", device=torch.device("cpu"))
    assert cfg.method.name == "bayesncl"
    for k, v in a.state_dict().items():
        assert torch.equal(v, tensors[k]) and torch.equal(v, b.state_dict()[k]), k
    # shared on its own: the config travels in the safetensors metadata
    alone = tmp_path / "shared" / "enc.safetensors"
    alone.parent.mkdir()
    shutil.copy(run / "encoder.safetensors", alone)
    c, cfg_alone, out_dir = load_trained(alone, device=torch.device("cpu"))
    assert cfg_alone == cfg and out_dir == alone.parent
    assert all(torch.equal(v, c.state_dict()[k]) for k, v in a.state_dict().items())
    # an export without the metadata (older bayesncl) needs the run's config.yaml beside it
    from safetensors.torch import save_file

    save_file(tensors, str(alone), metadata={"format": "bayesncl-encoder-v1"})
    with pytest.raises(EvalError) as info:
        load_trained(alone)
    assert str(info.value) == (
        f"{alone} records no config (an export from an older bayesncl) and no config.yaml is beside it: "
        "copy the run's config.yaml next to it"
    )
    shutil.copy(run / "config.yaml", alone.parent / "config.yaml")
    assert load_trained(alone, device=torch.device("cpu"))[1] == cfg


# ----------------------------------------------------------------------------- official layout
def official_module(
    *,
    arch: str = "resnet18",
    cifar: bool = True,
    hidden: int = 64,
    dim: int = 32,
    gate_depth: int = 2,
    gate_hidden: int = 48,
    num_classes: int = 10,
    projector_bn: bool = False,
    in_channels: int = 3,
) -> nn.ModuleDict:
    """A module with the authors' (solo-learn SimCLR + BayesNCL) parameter names, written here
    from their layout: torchvision ResNet without fc (CIFAR: 3x3 conv1 with padding 2, no max-pool),
    projector Linear-ReLU-Linear, gating head of 1-3 Linear layers, linear classifier."""
    torch.manual_seed(0)
    net = getattr(torchvision.models, arch)(weights=None)
    net.fc = nn.Identity()
    if cifar:
        net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=2, bias=False)
        net.maxpool = nn.Identity()
    h = net.inplanes
    mid: list[nn.Module] = [nn.BatchNorm1d(hidden)] if projector_bn else []
    parts: dict[str, nn.Module] = {
        "backbone": net,
        "projector": nn.Sequential(nn.Linear(h, hidden), *mid, nn.ReLU(), nn.Linear(hidden, dim)),
        "classifier": nn.Linear(h, num_classes),
    }
    if gate_depth == 1:
        parts["gating_head"] = nn.Sequential(nn.Linear(h, dim))
    elif gate_depth == 2:
        g = gate_hidden
        parts["gating_head"] = nn.Sequential(nn.Linear(h, g), nn.ReLU(), nn.Linear(g, dim))
    elif gate_depth == 3:
        half = gate_hidden // 2
        parts["gating_head"] = nn.Sequential(
            nn.Linear(h, gate_hidden), nn.ReLU(),
            nn.Linear(gate_hidden, half), nn.ReLU(),
            nn.Linear(half, dim),
        )
    module = nn.ModuleDict(parts).eval()
    for m in module.modules():  # non-trivial BatchNorm statistics, so eval mode matters
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return module


def save_lightning(module: nn.Module, path: Path) -> Path:
    """The shape of a PyTorch Lightning checkpoint: training state around ``state_dict``."""
    torch.save(
        {
            "epoch": 199,
            "global_step": 39000,
            "pytorch-lightning_version": "2.0.0",
            "state_dict": module.state_dict(),
            "loops": {"fit_loop": {"epoch_progress": {"current": {"completed": 200}}}},
            "optimizer_states": [{"state": {}, "param_groups": [{"lr": 0.4, "params": [0]}]}],
            "lr_schedulers": [{"last_epoch": 39000, "base_lrs": [0.4]}],
            "callbacks": {},
        },
        path,
    )
    return path


@pytest.mark.parametrize(
    ("depth", "hidden"),
    [(None, 0), (1, 0), *(pytest.param(d, 48, marks=pytest.mark.slow) for d in (2, 3))],
)  # a ResNet-18 each: the gate's deeper layouts with --run-slow
def test_official_layout_is_inferred_and_loads_bit_exactly(
    tmp_path: Path, depth: int | None, hidden: int
) -> None:
    ref = official_module(gate_depth=depth or 0, gate_hidden=48)
    path = save_lightning(ref, tmp_path / "last.ckpt")
    model, cfg = load_official_checkpoint(path)
    assert (cfg.model.backbone, cfg.model.cifar_stem, cfg.model.proj_hidden, cfg.model.proj_dim) == (
        "resnet18", "true", 64, 32,
    )
    assert cfg.method.name == ("bayesncl" if depth else "ncl")
    if depth:
        assert (cfg.method.gate_depth, cfg.method.gate_hidden) == (depth, hidden)
    assert model.classifier.out_features == 10
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        h = ref["backbone"](x)
        out = model(x)
        assert torch.equal(out.h, h)  # same stem padding (2) as solo-learn
        assert torch.equal(out.p, ref["projector"](h))
        if depth:
            assert torch.equal(out.alpha, torch.sigmoid(ref["gating_head"](h)))


def test_official_resnet50_imagenet_stem_is_inferred() -> None:
    sd = {f"backbone.{k}": v for k, v in torchvision.models.resnet50().state_dict().items() if "fc." not in k}
    sd |= {"projector.0.weight": torch.zeros(128, 2048), "projector.0.bias": torch.zeros(128)}
    sd |= {"projector.2.weight": torch.zeros(64, 128), "projector.2.bias": torch.zeros(64)}
    cfg, facts = infer_official_config(sd, ["method.name=cl"])
    assert (cfg.model.backbone, cfg.model.cifar_stem, cfg.method.name, cfg.method.nonneg) == (
        "resnet50", "false", "cl", "identity",
    )
    assert facts == {"in_channels": 3, "num_classes": None, "h_dim": 2048}


def test_official_bare_state_dict_with_ddp_prefix_is_accepted(tmp_path: Path) -> None:
    sd = {f"module.{k}": v for k, v in official_module().state_dict().items()}
    torch.save(sd, tmp_path / "weights.pt")
    model, cfg = load_official_checkpoint(tmp_path / "weights.pt")
    assert cfg.method.name == "bayesncl"
    assert official_state_dict(sd).keys() == {k[len("module."):] for k in sd}


@pytest.mark.slow
def test_official_checkpoint_extract_and_evaluate_from_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = save_lightning(official_module(), tmp_path / "last.ckpt")
    data = ["data.name=synthetic", "data.test_subset=60", "data.train_subset=100"]
    out = tmp_path / "f.npz"
    assert main(["extract", str(path), *data, "--out", str(out)]) == 0
    fs = load_features(out)
    assert fs.features.shape == (60, 32) and fs.alpha is not None and fs.meta["method"] == "bayesncl"
    assert main(["evaluate", str(path), *data, "--no-knn", "--retrieval-dims", "16,32"]) == 0
    assert (tmp_path / "evaluation.json").exists()


@pytest.mark.parametrize(
    ("kwargs", "overrides", "expected"),
    [
        (
            {"projector_bn": True},
            [],
            "projector does not have the layout bayesncl can import: expected Linear-ReLU-Linear: "
            "projector.0.weight (hidden, H), projector.0.bias (hidden,), projector.2.weight (D, hidden), "
            "projector.2.bias (D,); found projector.0.bias (64,), projector.0.weight (64, 512), "
            "projector.1.bias (64,), projector.1.num_batches_tracked () and 5 more",
        ),
        (
            {"gate_depth": 3, "gate_hidden": 48},
            ["model.proj_dim=16"],
            "does not fit the architecture inferred from its shapes and the overrides (bayesncl: resnet18 "
            "(CIFAR stem), projector hidden 64 -> 16, gate depth 3): shape mismatch: projector.2.weight "
            "expected (16, 64) found (32, 64), projector.2.bias expected (16,) found (32,), "
            "gating_head.4.weight expected (16, 24) found (32, 24), gating_head.4.bias expected (16,) "
            "found (32,)",
        ),
        (
            {"gate_depth": 2},
            ["method.name=ncl"],
            "unexpected: gating_head.0.weight (48, 512), gating_head.0.bias (48,), gating_head.2.weight "
            "(32, 48), gating_head.2.bias (32,)",
        ),
        ({"arch": "resnet34"}, [], "unsupported ResNet: found basic blocks per stage (3, 4, 6, 3)"),
    ],
)
def test_official_mismatch_lists_expected_and_found_shapes(
    tmp_path: Path, kwargs: dict, overrides: list[str], expected: str
) -> None:
    path = save_lightning(official_module(**kwargs), tmp_path / "x.ckpt")
    with pytest.raises(CheckpointError) as info:
        load_official_checkpoint(path, overrides)
    assert "\n" not in str(info.value)
    assert expected in str(info.value)


def test_official_gate_middle_layer_of_another_width_is_a_shape_error(tmp_path: Path) -> None:
    sd = official_module(gate_depth=3, gate_hidden=48).state_dict()
    sd["gating_head.2.weight"] = torch.zeros(20, 48)  # ours uses hidden // 2 = 24
    sd["gating_head.2.bias"] = torch.zeros(20)
    sd["gating_head.4.weight"] = torch.zeros(32, 20)
    torch.save({"state_dict": sd}, tmp_path / "x.ckpt")
    with pytest.raises(CheckpointError, match=r"gating_head\.2\.weight expected \(24, 48\) found \(20, 48\)"):
        load_official_checkpoint(tmp_path / "x.ckpt")


def test_official_checkpoint_of_another_backbone_or_with_extra_parts(tmp_path: Path) -> None:
    vit = {"backbone.cls_token": torch.zeros(1, 1, 192), "backbone.pos_embed": torch.zeros(1, 65, 192)}
    torch.save({"state_dict": vit}, tmp_path / "vit.ckpt")
    with pytest.raises(CheckpointError, match="the backbone is not a ResNet"):
        load_official_checkpoint(tmp_path / "vit.ckpt")
    sd = official_module().state_dict() | {"momentum_projector.0.weight": torch.zeros(2, 2)}
    torch.save({"state_dict": sd}, tmp_path / "byol.ckpt")
    with pytest.raises(CheckpointError, match="unexpected parts momentum_projector"):
        load_official_checkpoint(tmp_path / "byol.ckpt")


def test_official_checkpoint_needs_the_data_and_matching_channels(tmp_path: Path) -> None:
    path = save_lightning(official_module(), tmp_path / "x.ckpt")
    with pytest.raises(EvalError, match="does not record its data: pass it as overrides"):
        load_trained(path)
    gray = official_module(in_channels=1)
    path = save_lightning(gray, tmp_path / "gray.ckpt")
    with pytest.raises(EvalError, match="expects 1-channel images but data.name=synthetic has 3"):
        load_trained(path, overrides=["data.name=synthetic"])


@pytest.mark.slow
def test_own_checkpoint_overrides_are_limited_to_data_and_eval(tmp_path: Path) -> None:
    run = tmp_path / "run"
    pretrain(build_config(overrides=TINY), run, evaluate=False)
    _, cfg, _ = load_trained(run, overrides=["data.test_subset=30", "eval.batch_size=16"])
    assert (cfg.data.test_subset, cfg.eval.batch_size) == (30, 16)
    with pytest.raises(EvalError, match="model.proj_dim cannot be overridden for a bayesncl checkpoint"):
        load_trained(run, overrides=["model.proj_dim=8"])
    with pytest.raises(ConfigError, match=r"unknown config key 'eval.batchsize'.*eval.batch_size"):
        load_trained(run, overrides=["eval.batchsize=16"])
    with pytest.raises(ConfigError, match="unknown config key 'bogus.key'"):
        load_trained(run, overrides=["bogus.key=1"])


@pytest.mark.slow
def test_own_checkpoint_with_weights_of_another_architecture(tmp_path: Path) -> None:
    run = tmp_path / "run"
    pretrain(build_config(overrides=TINY), run, evaluate=False)
    ckpt = torch.load(run / "last.pt", weights_only=True)
    ckpt["state_dict"]["projector.net.2.weight"] = torch.zeros(8, 32)
    torch.save(ckpt, tmp_path / "edited.pt")
    with pytest.raises(EvalError) as info:
        load_trained(tmp_path / "edited.pt")
    assert "does not fit the architecture its config describes: shape mismatch: projector.net.2.weight " \
        "expected (16, 32) found (8, 32)" in str(info.value)


def test_log_csv_has_plain_newlines(tmp_path: Path) -> None:
    write_log(tmp_path, [{"epoch": 1, "step": 3, "loss": 1.5}, {"epoch": 2, "step": 6, "loss": 1.25}])
    assert (tmp_path / "log.csv").read_bytes() == (
        ",".join(LOG_FIELDS) + "\n1,3,1.5" + "," * (len(LOG_FIELDS) - 3) + "\n2,6,1.25"
        + "," * (len(LOG_FIELDS) - 3) + "\n"
    ).encode()


def test_data_override_that_changes_the_stem_is_blamed_on_the_image_size(tmp_path: Path) -> None:
    # ResNet-18 with model.cifar_stem=auto: a 3x3 stem at 16 px, the 7x7 ImageNet stem at 96 px
    cfg = build_config(overrides=[*TINY, "model.backbone=resnet18"])
    ckpt = {
        "format": "bayesncl-checkpoint-v1",
        "config": cfg.to_dict(),
        "state_dict": build_model(cfg, 3, 16, 10).state_dict(),
    }
    torch.save(ckpt, tmp_path / "r18.pt")
    with pytest.raises(EvalError) as info:
        load_trained(tmp_path / "r18.pt", overrides=["data.image_size=96"])
    assert str(info.value) == (
        f"{tmp_path / 'r18.pt'}: data.name=synthetic with data.image_size=96 gives 96 px images but the "
        "model was trained on 16 px synthetic images, and model.cifar_stem=auto builds another first layer "
        "for them: set data.image_size=16"
    )
    model, cfg2, _ = load_trained(tmp_path / "r18.pt", overrides=["data.image_size=16"])
    assert cfg2.data.image_size == 16
