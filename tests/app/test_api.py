"""``import bayesncl``: the main API, that importing it stays cheap, and (issue 17) pretraining on
Python data, load_encoder without data, and ContrastiveHead in a plain loop and in Lightning
(the examples of docs/api.md)."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import bayesncl
from bayesncl.config import ConfigError
from bayesncl.data import DataError, provided

from ..conftest import ROOT, SRC, TINY_BASE, expect


def test_import_loads_no_torch() -> None:
    src = SRC
    code = "import sys, bayesncl; print('torch' in sys.modules, sorted(bayesncl.__all__))"
    env = {"PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    names = (
        "['CheckpointError', 'ConfigError', 'ContrastiveHead', 'DataError', 'EvalError', 'RunDirError', "
        "'build_config', 'evaluate', 'finetune', 'load_encoder', 'load_plugin', 'methods', 'metrics', "
        "'pretrain', 'register_method']"
    )
    assert out.stdout == f"False {names}\n"


def test_help_lists_the_lazy_api_with_signatures() -> None:
    import pydoc

    assert dir(bayesncl) == sorted([*bayesncl.__all__, "__version__"])  # no Any, Path, importlib
    text = pydoc.render_doc(bayesncl, renderer=pydoc.plaintext)
    signatures = (
        "pretrain(", "evaluate(", "finetune(", "load_encoder(", "class ContrastiveHead", "build_config("
    )
    for signature in signatures:
        assert signature in text, signature


def test_build_config_takes_overrides_then_a_recipe() -> None:
    cfg = bayesncl.build_config(["method.name=ncl", "train.epochs=30"])
    assert (cfg.method.name, cfg.train.epochs) == ("ncl", 30)
    assert bayesncl.build_config(config="fashion-mnist-demo").data.name == "fashion-mnist"
    with pytest.raises(ConfigError, match="unknown config key 'method.bogus'"):
        bayesncl.build_config(["method.bogus=1"])
    with pytest.raises(AttributeError):
        bayesncl.bogus  # noqa: B018


def test_the_one_line_errors_are_at_the_top_level() -> None:
    """docs/api.md: a call raises the command line's one-line errors, catchable as ``bayesncl.ConfigError``,
    ``bayesncl.DataError``, ... (all ValueError)."""
    assert bayesncl.ConfigError is ConfigError and bayesncl.DataError is DataError
    for name in ("ConfigError", "DataError", "EvalError", "RunDirError", "CheckpointError"):
        assert issubclass(getattr(bayesncl, name), ValueError), name
    with pytest.raises(bayesncl.ConfigError, match="method.ipw=true"):
        bayesncl.build_config(["method.name=ncl-ipw", "method.gate=ste"])


@pytest.mark.slow
def test_pretrain_evaluate_load_encoder_and_metrics(tmp_path: Path) -> None:
    import torch

    from bayesncl.app.api import evaluate, pretrain
    from bayesncl.core.model import ContrastiveModel

    assert bayesncl.pretrain is pretrain and bayesncl.evaluate is evaluate
    cfg = bayesncl.build_config([*TINY_BASE, "train.epochs=1"])
    run = tmp_path / "run"
    assert bayesncl.pretrain(cfg, run, evaluate=False) == {}
    report = bayesncl.evaluate(run, knn=False, probe="none")
    assert 0 <= report["semantic_consistency"] <= 100
    model = bayesncl.load_encoder(run, torch.device("cpu"))
    assert isinstance(model, ContrastiveModel) and not model.training
    x = torch.zeros(2, 3, 16, 16)
    assert model(x).z.shape == (2, cfg.model.proj_dim)
    assert bayesncl.metrics.semantic_consistency is not None
    assert bayesncl.metrics.compute_all is bayesncl.metrics.registry.compute_all


DOCS = ROOT / "docs" / "api.md"
PY = [*TINY_BASE, "train.epochs=1", "data.train_subset=0", "data.test_subset=0"]


def _images(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """n 16 px RGB images of 4 classes whose class is the brightness of a square (learnable)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 4
    x = torch.randint(0, 60, (n, 3, 16, 16), dtype=torch.uint8, generator=g)
    x[:, :, 4:12, 4:12] += (y * 60).to(torch.uint8).view(n, 1, 1, 1)
    return x, y


def _doc_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOCS.read_text(encoding="utf-8"), flags=re.S)


def test_build_config_sets_dict_entries_and_refuses_a_string(tmp_path: Path) -> None:
    cfg = bayesncl.build_config(["method.name=ncl", "model.backbone_kwargs.depth=2",
                                 "model.backbone=timm:vit_tiny_patch16_224"])
    assert (cfg.method.name, cfg.method.gate, cfg.model.backbone_kwargs) == ("ncl", "none", {"depth": 2})
    vit = bayesncl.build_config([], config="fashion-mnist-vit")
    assert vit.model.backbone_kwargs == {"patch_size": 4, "depth": 4, "embed_dim": 96}
    with pytest.raises(ConfigError) as e:
        bayesncl.build_config("method.name=ncl")  # type: ignore[arg-type]
    expect("Y23", str(e.value), tmp_path)


@pytest.mark.slow
def test_pretrain_on_a_uint8_tensor_evaluate_and_load_encoder(tmp_path: Path) -> None:
    x, y = _images()
    cfg = bayesncl.build_config(PY)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        test = torch.utils.data.TensorDataset(x[:40], y[:40])
        m = bayesncl.pretrain(cfg, dataset=x, labels=y, eval_dataset=test, run_dir=tmp_path / "run")
    assert m["n_test"] == 40 and 0 <= m["linear_probe_acc1"] <= 100
    assert "data.name=python" not in (tmp_path / "run" / "config.yaml").read_text()  # YAML form
    assert "name: python" in (tmp_path / "run" / "config.yaml").read_text()
    assert "image_size: 16" in (tmp_path / "run" / "config.yaml").read_text()  # the geometry is recorded
    assert not provided._PROVIDED  # released after the run
    a = bayesncl.load_encoder(tmp_path / "run")
    b = bayesncl.load_encoder(tmp_path / "run" / "encoder.safetensors")
    assert isinstance(a, torch.nn.Module) and not a.training
    probe = torch.randn(5, 3, 16, 16)
    with torch.no_grad():
        oa, ob = a(probe), b(probe)
    assert oa.z_tilde.shape == (5, 16) and torch.equal(oa.z_tilde, ob.z_tilde)
    res = bayesncl.evaluate(tmp_path / "run", dataset=torch.utils.data.TensorDataset(x, y),
                            eval_dataset=torch.utils.data.TensorDataset(x[40:], y[40:]), knn=False)
    assert "linear_probe_acc1" in res and (tmp_path / "run" / "evaluation.json").is_file()
    with pytest.raises(DataError) as e:
        bayesncl.evaluate(tmp_path / "run")  # the images are gone: one line saying how to give them
    expect("Y22", str(e.value), tmp_path)
    with pytest.warns(UserWarning, match="4 classes but eval.data.name=synthetic has 10;"):  # not data.name
        other = bayesncl.evaluate(tmp_path / "run", ["eval.data.name=synthetic", "eval.data.test_subset=30",
                                                     "eval.data.train_subset=60"], knn=False)
    assert other["linear_probe_acc1"] >= 0  # eval.data.* alone: the training data need not be here


@pytest.mark.slow
def test_pretrain_without_labels_trains_without_the_probe_and_says_how_to_evaluate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x, _ = _images()
    cfg = bayesncl.build_config(PY)
    capsys.readouterr()
    assert bayesncl.pretrain(cfg, dataset=x, run_dir=tmp_path / "run") == {}  # trains, does not evaluate
    expect("Y14", capsys.readouterr().out.strip().splitlines()[-1], tmp_path)
    assert not (tmp_path / "run" / "metrics.json").exists()
    header = (tmp_path / "run" / "log.csv").read_text().splitlines()[0].split(",")
    assert "online_acc" not in header and "info_nce" in header  # no probe accuracy without labels


def test_a_dataset_of_pil_images_with_or_without_labels() -> None:
    from PIL import Image

    x, y = _images(8)
    pil = [Image.fromarray(x[i].permute(1, 2, 0).numpy()) for i in range(8)]
    s = provided.as_split([(pil[i], int(y[i])) for i in range(8)], "dataset")
    assert torch.equal(s.images, x) and s.labels.tolist() == y.tolist() and s.labeled
    s = provided.as_split(pil, "dataset")  # images alone
    assert not s.labeled and s.class_names == ("(unlabeled)",)
    gray = provided.as_split([Image.fromarray(x[i, 0].numpy()) for i in range(8)], "dataset")
    assert gray.images.shape == (8, 1, 16, 16) and torch.equal(gray.images[:, 0], x[:, 0])
    floats = provided.as_split([(x[i].float() / 255, y[i]) for i in range(8)], "dataset")
    assert torch.equal(floats.images, x)  # floats in [0, 1] round back to the same bytes


def test_bad_python_data_is_one_line(tmp_path: Path) -> None:
    """Each bad dataset gets its row's message, from provided.as_split and from bayesncl.pretrain (the
    call the rows name), before a run dir is made."""
    image = torch.zeros(3, 4, 4)
    mixed = [torch.zeros(3, 16, 16, dtype=torch.uint8), torch.zeros(3, 20, 24, dtype=torch.uint8)]
    native = bayesncl.build_config([*PY, "data.image_size=0"])
    for row, dataset in [
        ("Y15", ["a.png"]),
        ("Y16", [torch.zeros(3, 4, 4, dtype=torch.long)]),
        ("Y17", 5),
        ("Y18", torch.zeros(2, 3, 8, 8)),
        ("Y19", [(image, 1), image]),
        ("Y20", [(image, 1.5)]),
        ("Y21", mixed),
    ]:
        with pytest.raises(DataError) as e:
            provided.as_split(dataset, "dataset")
        expect(row, str(e.value), tmp_path)
        with pytest.raises(DataError) as e:
            bayesncl.pretrain(native, dataset=dataset, run_dir=tmp_path / "r")
        expect(row, str(e.value), tmp_path)
        assert not (tmp_path / "r").exists() and not provided._PROVIDED
    assert provided.as_split(mixed, "dataset", image_size=12).images.shape == (2, 3, 12, 12)


def test_metrics_compute_all_is_reachable_from_the_package() -> None:
    f = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    out = bayesncl.metrics.compute_all(f, np.array([0, 0, 1, 1]))
    assert out["semantic_consistency"] == pytest.approx(100.0)  # each dim fires for one class only


def test_head_equals_the_full_model_after_its_backbone() -> None:
    from bayesncl.core.model import build_model, contrastive_loss

    cfg = bayesncl.build_config(["model.backbone=small_cnn", "model.proj_hidden=32", "model.proj_dim=16"])
    torch.manual_seed(0)
    model = build_model(cfg, 3, 16, 10)
    head = bayesncl.ContrastiveHead(256, cfg)
    missing = head.load_state_dict(
        {k: v for k, v in model.state_dict().items() if k.startswith(("projector.", "gating_head."))}
    )
    assert not missing.missing_keys and not missing.unexpected_keys  # the full model's names
    h1, h2 = torch.randn(6, 256), torch.randn(6, 256)
    torch.manual_seed(1)
    loss, stats = head(h1, h2)
    torch.manual_seed(1)
    ref, parts = contrastive_loss(model.project(torch.cat([h1, h2])), cfg.method)
    assert loss.item() == pytest.approx(ref.item())
    assert stats["kl"].item() == pytest.approx(parts["kl"].item())
    mask = head.features(torch.cat([h1, h2])).mask
    assert 0 <= stats["gate_open"].item() <= 1 and mask is not None and mask.shape == (12, 16)


def test_head_param_groups_put_the_gate_at_its_ratio_and_cover_every_parameter_once() -> None:
    cfg = bayesncl.build_config(["method.gate_lr_ratio=0.25", "model.proj_hidden=32", "model.proj_dim=16"])
    head = bayesncl.ContrastiveHead(64, cfg)
    groups = head.param_groups(lr=0.4, weight_decay=1e-4)
    by_name = {g["name"]: g for g in groups}
    assert by_name["gating_head/weight"]["lr"] == pytest.approx(0.1)
    assert by_name["projector/weight"]["lr"] == pytest.approx(0.4)
    assert by_name["projector/plain"]["weight_decay"] == 0.0
    assert by_name["projector/weight"]["weight_decay"] == 1e-4
    ids = [id(p) for g in groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in head.parameters()) and len(set(ids)) == len(ids)
    ncl = bayesncl.ContrastiveHead(64, bayesncl.build_config(["method.name=ncl"]))
    assert {g["name"].split("/")[0] for g in ncl.param_groups(0.1)} == {"projector"}


def test_head_param_groups_take_a_set_gate_lr_as_a_run_does() -> None:
    """``method.gate_lr`` > 0 (the CIFAR recipes' 0.1, the authors' fixed gating_head_lr) is the gating
    head's lr, as :func:`bayesncl.core.optim.peak_lrs` gives a run; ``gate_lr_ratio`` was used instead."""
    cfg = bayesncl.build_config(["model.proj_hidden=32"], config="cifar10-bayesncl")
    assert cfg.method.gate_lr == 0.1
    by_name = {g["name"]: g for g in bayesncl.ContrastiveHead(64, cfg).param_groups(lr=0.4)}
    assert by_name["gating_head/weight"]["lr"] == pytest.approx(0.1)
    assert by_name["gating_head/weight"]["lr_scale"] == pytest.approx(0.25)  # 0.1 / 0.4, for a schedule
    assert by_name["projector/weight"]["lr"] == pytest.approx(0.4)


@pytest.mark.slow
def test_the_plain_loop_example_of_docs_api_md_runs(capsys: pytest.CaptureFixture[str]) -> None:
    plain = next(b for b in _doc_blocks() if "for step in range" in b)
    exec(compile(plain, str(DOCS), "exec"), {})  # noqa: S102 - our own documentation
    printed = capsys.readouterr().out
    assert "'info_nce'" in printed and "'gate_open'" in printed


@pytest.mark.slow
def test_the_lightning_example_of_docs_api_md_runs() -> None:
    pytest.importorskip("lightning")
    block = next(b for b in _doc_blocks() if "LightningModule" in b)
    scope: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(block, str(DOCS), "exec"), scope)  # noqa: S102 - our own documentation
    trainer = scope["trainer"]
    assert trainer.global_step == 4  # 32 views / batch 8, one epoch
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
