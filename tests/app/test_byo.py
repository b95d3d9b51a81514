"""Bring your own backbone and data (issue 17): timm:NAME backbones, model.backbone_kwargs, STL-10's
binary format, unlabeled image folders, eval.data.*, the shipped ImageNet-100 class list."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from bayesncl.app.cli import main
from bayesncl.app.train import pretrain
from bayesncl.config import ConfigError, build_config, diff_configs, eval_data
from bayesncl.core.model import BackboneError, build_model
from bayesncl.data import DataError, clear_cache, dataset_info
from bayesncl.data.folders import read_class_list
from bayesncl.data.sources import load_split

from ..conftest import ERROR, RECIPES, TINY, TINY_BASE, error_line, expect

VIT = ["model.backbone=timm:vit_tiny_patch16_224", "model.backbone_kwargs.patch_size=4",
       "model.backbone_kwargs.depth=1", "model.proj_hidden=32", "model.proj_dim=16"]


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


# ----------------------------------------------------------------------------- config
def test_backbone_kwargs_is_a_dict_key_set_by_entry_or_whole(tmp_path: Path) -> None:
    cfg = build_config(overrides=[*VIT, "model.backbone_kwargs.img_size=16"])
    assert cfg.model.backbone_kwargs == {"patch_size": 4, "depth": 1, "img_size": 16}
    y = tmp_path / "c.yaml"
    y.write_text("model:\n  backbone: timm:resnet18\n  backbone_kwargs:\n    drop_rate: 0.1\n")
    assert build_config(y).model.backbone_kwargs == {"drop_rate": 0.1}
    whole = build_config(overrides=["model.backbone=timm:resnet18", "model.backbone_kwargs={drop_rate: 0.2}"])
    assert whole.model.backbone_kwargs == {"drop_rate": 0.2}
    again = build_config(cfg.to_dict())  # a run's config.yaml reads back the same
    assert again.model.backbone_kwargs == cfg.model.backbone_kwargs and not diff_configs(cfg, again)
    assert diff_configs(cfg, build_config(overrides=VIT)) == ["model.backbone_kwargs.img_size"]


def _config_error(row: str, overrides: list[str], tmp: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """``build_config(overrides)`` raises row ``row``'s message, which `bayesncl pretrain` prints as its
    one error line; returns the message."""
    with pytest.raises(ConfigError) as e:
        build_config(overrides=overrides)
    expect(row, ERROR + str(e.value), tmp)
    assert main(["pretrain", "--run-dir", str(tmp / "r"), *TINY, *overrides]) == 2
    assert error_line(capsys) == ERROR + str(e.value)
    assert not (tmp / "r").exists()
    return str(e.value)


def test_timm_names_and_kwargs_are_checked_by_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = _config_error("Y1", ["model.backbone=timm:vit_tiny_patch16"], tmp_path, capsys)
    start = "model.backbone=timm:vit_tiny_patch16: timm has no model 'vit_tiny_patch16'"
    assert message.startswith(start)
    assert "vit_tiny_patch16_224" in message  # the close names
    with pytest.raises(ConfigError) as e:
        build_config(overrides=["model.backbone_kwargs.depth=2"])  # the default backbone, resnet18
    expect("Y2", ERROR + str(e.value), tmp_path)
    _config_error("Y2", ["model.backbone=resnet18", "model.backbone_kwargs.depth=2"], tmp_path, capsys)
    _config_error("Y3", [*VIT, "model.backbone_kwargs.in_chans=4"], tmp_path, capsys)
    _config_error("Y4", [*VIT, "model.backbone_kwargs.depth={a: 1}"], tmp_path, capsys)
    _config_error("Y5", ["model.backbone_kwarg.depth=1"], tmp_path, capsys)


def test_eval_data_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = build_config(overrides=["data.name=synthetic", "data.image_size=16", "eval.data.name=cifar10",
                                  "eval.data.root=/x"])
    e = eval_data(cfg)
    assert (e.name, e.root, e.image_size, e.labels) == ("cifar10", "/x", 16, "auto")  # the training geometry
    assert eval_data(build_config(overrides=["data.labels=none"])).labels == "auto"
    _config_error("Y8", ["eval.data.root=/x"], tmp_path, capsys)
    _config_error("Y9", ["eval.data.name=cifar"], tmp_path, capsys)


# ----------------------------------------------------------------------------- timm backbones
@pytest.mark.parametrize(
    ("overrides", "channels", "size", "h_dim"),
    [
        (VIT, 1, 16, 192),  # img_size = the data's side, passed because ViT takes it
        # the others build larger models: with --run-slow
        pytest.param(["model.backbone=timm:convnext_atto"], 3, 32, 320, marks=pytest.mark.slow),  # 32x down
        pytest.param(["model.backbone=timm:resnet18"], 1, 16, 512, marks=pytest.mark.slow),  # no img_size
        # a pre-logits head (conv_head + act after the pool): h is its head_hidden_size, 1024, not the
        # last feature map's num_features, 288 (issue 23: it was refused as "expected (288,)")
        pytest.param(["model.backbone=timm:mobilenetv3_small_050"], 1, 32, 1024, marks=pytest.mark.slow),
    ],
)
def test_timm_backbones_build_without_classifier(
    overrides: list[str], channels: int, size: int, h_dim: int
) -> None:
    cfg = build_config(overrides=[*overrides, "model.proj_hidden=32", "model.proj_dim=16"])
    model = build_model(cfg, channels, size, 10)
    net = model.backbone
    assert model.h_dim == h_dim == (getattr(net, "head_hidden_size", None) or net.num_features)
    out = model(torch.randn(2, channels, size, size))
    assert out.h.shape == (2, h_dim) and out.z_tilde.shape == (2, 16)


@pytest.mark.slow
def test_timm_build_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    kwargs = ["model.backbone=timm:resnet18", "model.backbone_kwargs.patch_size=4"]
    with pytest.raises(BackboneError) as e:
        build_model(build_config(overrides=kwargs), 3, 16, 10)
    expect("Y6", ERROR + str(e.value), tmp_path)
    assert main(["pretrain", "--run-dir", str(tmp_path / "r"), *TINY, *kwargs]) == 2  # before training
    expect("Y6", error_line(capsys), tmp_path)
    import timm

    def refuse(*args, **kwargs):
        raise RuntimeError("in_chans must be 3 for this stem\n(more detail)")

    monkeypatch.setattr(timm, "create_model", refuse)
    with pytest.raises(BackboneError) as e:
        build_model(build_config(overrides=["model.backbone=timm:resnet18"]), 1, 16, 10)
    expect("Y7", ERROR + str(e.value), tmp_path)
    assert str(e.value).endswith(" (RuntimeError: in_chans must be 3 for this stem)")  # its first line


@pytest.mark.slow
def test_pretrain_a_tiny_vit_and_reload_it(tmp_path: Path) -> None:
    from bayesncl.app.api import load_encoder

    cfg = build_config(overrides=[*TINY_BASE, *VIT, "train.epochs=1", "train.optimizer=adamw",
                                  "train.base_lr=1e-3", "eval.probe=none"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metrics = pretrain(cfg, tmp_path / "run")
    assert metrics["n_test"] == 60 and "semantic_consistency" in metrics
    model = load_encoder(tmp_path / "run")
    assert type(model.backbone).__name__ == "VisionTransformer"
    assert model.backbone.patch_embed.patch_size == (4, 4)


# ----------------------------------------------------------------------------- STL-10
def _write_stl10(root: Path, n_train: int = 6, n_test: int = 4, n_unlabeled: int = 5) -> dict:
    """A tiny stl10_binary/ in the real format: each image's channels column-major, labels 1..10."""
    d = root / "stl10_binary"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    out = {}
    for split, n in (("train", n_train), ("test", n_test), ("unlabeled", n_unlabeled)):
        x = rng.integers(0, 256, (n, 3, 96, 96), dtype=np.uint8)  # (N, C, H, W) row-major
        out[split] = x
        x.transpose(0, 1, 3, 2).tofile(d / f"{split}_X.bin")  # stored (N, C, W, H)
        if split != "unlabeled":
            y = (np.arange(n) % 10 + 1).astype(np.uint8)
            y.tofile(d / f"{split}_y.bin")
    names = ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]
    (d / "class_names.txt").write_text("\n".join(names) + "\n")
    return out


def test_stl10_binary_format(tmp_path: Path) -> None:
    written = _write_stl10(tmp_path)
    cfg = build_config(overrides=["data.name=stl10", f"data.root={tmp_path}"])
    train = load_split(cfg.data, "train")
    assert torch.equal(train.images, torch.from_numpy(written["train"]))  # transposed back to (C, H, W)
    assert train.labels.tolist() == [0, 1, 2, 3, 4, 5] and train.class_names[2] == "car"
    info = dataset_info(cfg.data)
    assert (info.channels, info.image_size, info.num_classes, info.num_test) == (3, 96, 10, 4)
    ref = torch.from_numpy(written["train"]).double() / 255
    assert info.mean == pytest.approx(tuple(ref.mean((0, 2, 3)).tolist()))  # measured on the train split
    assert info.std == pytest.approx(tuple(ref.std((0, 2, 3)).tolist()))
    unl = load_split(build_config(overrides=["data.name=stl10", f"data.root={tmp_path / 'stl10_binary'}",
                                             "data.labels=none"]).data, "train")
    assert not unl.labeled and len(unl) == 11 and unl.class_names == ("(unlabeled)",)
    both = np.concatenate([written["unlabeled"], written["train"]])  # unlabeled first, then train
    assert torch.equal(unl.images, torch.from_numpy(both))


def test_stl10_bad_files_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def refused(row: str, overrides: list[str], split: str) -> None:
        """load_split raises row ``row``'s message, and `bayesncl pretrain` prints it, before the run dir."""
        clear_cache()
        with pytest.raises(DataError) as e:
            load_split(build_config(overrides=overrides).data, split)
        expect(row, ERROR + str(e.value), tmp_path)
        clear_cache()
        whole = ["data.train_subset=0", "data.test_subset=0"]  # tiny STL-10 splits: no subset
        assert main(["pretrain", "--run-dir", str(tmp_path / "r"), *TINY, *whole, *overrides]) == 2
        assert error_line(capsys) == ERROR + str(e.value)
        assert not (tmp_path / "r").exists()

    stl10 = ["data.name=stl10", f"data.root={tmp_path}"]
    refused("Y10", stl10, "train")
    _write_stl10(tmp_path)
    with (tmp_path / "stl10_binary" / "test_X.bin").open("ab") as f:
        f.write(b"\0" * 10)
    refused("Y11", stl10, "test")
    (tmp_path / "stl10_binary" / "unlabeled_X.bin").unlink()
    refused("Y12", [*stl10, "data.labels=none"], "train")


# ----------------------------------------------------------------------------- image folders
def _png(path: Path, value: int, size: int = 16) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size, size, 3), value, dtype=np.uint8)).save(path)


@pytest.mark.slow
def test_an_unlabeled_folder_pretrains_and_evaluates_on_eval_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(40):
        _png(tmp_path / "pics" / f"day{i % 2}" / f"{i}.png", 5 * i, size=16 + i % 3)  # nested, mixed sizes
    base = [*TINY_BASE, "data.name=imagefolder", f"data.root={tmp_path / 'pics'}", "data.train_subset=0",
            "data.test_subset=0", "train.epochs=1"]
    cfg = build_config(overrides=base)
    info = dataset_info(cfg.data)
    assert (info.labeled, info.num_train, info.num_test, info.num_classes) == (False, 40, 0, 1)
    # no labels and no eval.data.*: it trains, then says how to evaluate instead of evaluating (issue 26)
    capsys.readouterr()
    assert pretrain(cfg, tmp_path / "unlabelled") == {}
    expect("Y13", capsys.readouterr().out.strip().splitlines()[-1], tmp_path)
    run = tmp_path / "unlabelled"
    assert (run / "last.pt").exists() and not (run / "metrics.json").exists()
    assert main(["pretrain", "--run-dir", str(tmp_path / "cli"), *base]) == 0
    expect("Y13", capsys.readouterr().out.strip().splitlines()[-1].replace("cli", "unlabelled"), tmp_path)
    assert pretrain(cfg, tmp_path / "plain", evaluate=False) == {}
    assert "no end-of-training evaluation" not in capsys.readouterr().out  # --no-eval: nothing to say
    # an explicit request that cannot be met is still refused before anything is written
    unlabelled_eval = build_config(overrides=[*base, "eval.data.name=imagefolder",
                                              f"eval.data.root={tmp_path / 'pics'}"])
    with pytest.raises(DataError, match="eval.data.name=imagefolder has no labels"):
        pretrain(unlabelled_eval, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    with_eval = build_config(overrides=[*base, "eval.data.name=synthetic", "eval.data.test_subset=50",
                                        "eval.data.train_subset=100"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metrics = pretrain(with_eval, tmp_path / "run")
    assert metrics["n_test"] == 50 and "linear_probe_acc1" in metrics  # evaluated on synthetic


def test_labels_none_ignores_the_class_folders(tmp_path: Path) -> None:
    for c in ("a", "b"):
        for i in range(3):
            _png(tmp_path / "train" / c / f"{i}.png", 10 * i)
            _png(tmp_path / "val" / c / f"{i}.png", 10 * i)
    labelled = build_config(overrides=["data.name=imagefolder", f"data.root={tmp_path}"]).data
    assert dataset_info(labelled).num_classes == 2
    cfg = build_config(overrides=["data.name=imagefolder", f"data.root={tmp_path}", "data.labels=none"])
    info = dataset_info(cfg.data)
    assert (info.labeled, info.num_train, info.num_classes, info.num_test) == (False, 6, 1, 6)
    assert dataset_info(eval_data(cfg)).labeled  # evaluation reads the same folder with its labels


def test_the_shipped_imagenet100_list_selects_the_subset_of_a_full_folder(tmp_path: Path) -> None:
    names = read_class_list("imagenet100")
    assert len(names) == 100 and "n01558993" in names and list(names) == sorted(names)
    for c in [*names, "n99999999"]:  # a "full ImageNet": one class more than the subset
        _png(tmp_path / "train" / c / "0.png", 100, size=8)
        _png(tmp_path / "val" / c / "0.png", 100, size=8)
    cfg = build_config(
        overrides=["data.name=imagefolder", f"data.root={tmp_path}", "data.classes=imagenet100"]
    )
    info = dataset_info(cfg.data)
    assert info.num_classes == 100 and info.class_names == names and info.num_train == 100
    recipe = build_config(RECIPES / "imagenet100-bayesncl.yaml")
    assert recipe.data.classes == "imagenet100"
