"""Out-of-distribution transfer: corrupted copies (imagecorruptions), the released sets' folder
layouts, the probe fitted once, ``bayesncl ood`` and its bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bayesncl.app.cli import main
from bayesncl.data import DataError

from ..conftest import TINY_BASE, error_line, expect, image_folder, tiny_checkpoint

pytest.importorskip("imagecorruptions")


def test_check_corruptions():
    from bayesncl.data.corruptions import check_corruptions

    assert check_corruptions(["fog"], [1, 5]) == (["fog"], [1, 5])
    with pytest.raises(DataError, match="unknown corruption 'fgo'"):
        check_corruptions(["fgo"], [1])
    for bad in (0, 6, 2.5, True):
        with pytest.raises(DataError, match="expected an integer from 1 to 5"):
            check_corruptions(["fog"], [bad])


def test_corrupt_images_deterministic_and_shapes():
    from bayesncl.data.corruptions import corrupt_images

    rng = np.random.default_rng(0)
    rgb = torch.from_numpy(rng.integers(0, 256, (3, 3, 32, 32), dtype=np.uint8))
    gray = torch.from_numpy(rng.integers(0, 256, (3, 1, 28, 28), dtype=np.uint8))  # Fashion-MNIST size
    for name in ("gaussian_noise", "impulse_noise", "glass_blur", "frost", "contrast"):
        a = corrupt_images(rgb, name, 3, seed=1)
        assert a.shape == rgb.shape and a.dtype == torch.uint8
        assert torch.equal(a, corrupt_images(rgb, name, 3, seed=1))  # the same seed: the same copy
        g = corrupt_images(gray, name, 3, seed=1)
        assert g.shape == gray.shape and torch.equal(g, corrupt_images(gray, name, 3, seed=1))
    assert not torch.equal(corrupt_images(rgb, "gaussian_noise", 3, seed=1),
                           corrupt_images(rgb, "gaussian_noise", 3, seed=2))
    # severity 5 noise moves the image further than severity 1
    d1 = (corrupt_images(rgb, "gaussian_noise", 1).float() - rgb.float()).abs().mean()
    d5 = (corrupt_images(rgb, "gaussian_noise", 5).float() - rgb.float()).abs().mean()
    assert d5 > d1 > 0
    # a gray image comes back as the luma of its corrupted RGB copy: brightness of a flat gray stays flat
    flat = torch.full((1, 1, 28, 28), 100, dtype=torch.uint8)
    assert corrupt_images(flat, "brightness", 2).unique().numel() == 1


def test_corrupted_test_split_is_cached(tmp_path: Path, monkeypatch):
    from bayesncl.config import build_config
    from bayesncl.data import corruptions

    cfg = build_config(overrides=TINY_BASE).data
    x, y = corruptions.corrupted_test_split(cfg, "contrast", 2, seed=0, cache=tmp_path)
    assert x.shape == (60, 3, 32, 32) and len(y) == 60 and len(list(tmp_path.glob("*.npy"))) == 1
    monkeypatch.setattr(corruptions, "corrupt_images", lambda *a, **k: pytest.fail("not read from the cache"))
    x2, _ = corruptions.corrupted_test_split(cfg, "contrast", 2, seed=0, cache=tmp_path)
    assert torch.equal(x, x2)


def test_fitted_probe_matches_the_fast_probe():
    from bayesncl.metrics import linear_probe
    from bayesncl.metrics.shift_probe import fit_probe

    rng = np.random.default_rng(0)
    ytr, yte = rng.integers(0, 3, 200), rng.integers(0, 3, 100)
    xtr = rng.normal(size=(200, 6)) + np.eye(6)[ytr] * 2
    xte = rng.normal(size=(100, 6)) + np.eye(6)[yte] * 2
    probe = fit_probe(xtr, ytr, seed=0)
    want = linear_probe(xtr, ytr, xte, yte, seeds=0)
    got = probe.accuracy(xte, yte)
    assert got["acc1"] == pytest.approx(want["acc1"]) and got["acc5"] == pytest.approx(want["acc5"])


# ----------------------------------------------------------------------------- released layouts
def _images(d: Path, n: int = 2) -> None:
    from PIL import Image

    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.fromarray(np.full((20, 20, 3), 40 * i, dtype=np.uint8)).save(d / f"{i}.png")


def test_released_layouts(tmp_path: Path):
    from bayesncl.data.shifted import class_folder_set, imagenet_c_sets

    classes = ("cat", "dog")
    for c in classes:
        for s in (1, 2):
            _images(tmp_path / "c" / "fog" / str(s) / c)
        _images(tmp_path / "sketch-release" / "sketch" / c, 3)
    _images(tmp_path / "stylized" / "dog")
    sets = imagenet_c_sets(tmp_path / "c", classes, severities=(1, 2))
    assert set(sets) == {("fog", 1), ("fog", 2)} and sets["fog", 2].labels.tolist() == [0, 0, 1, 1]
    assert class_folder_set(tmp_path / "sketch-release", classes).labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert class_folder_set(tmp_path / "stylized", classes).labels.tolist() == [1, 1]  # a class may be absent
    _images(tmp_path / "stylized" / "bird")
    with pytest.raises(DataError, match="class folders the model's train classes lack: bird"):
        class_folder_set(tmp_path / "stylized", classes)
    with pytest.raises(DataError, match="lacks fog/3/"):
        imagenet_c_sets(tmp_path / "c", classes, severities=(3,))


def test_ood_on_an_image_folder_reads_the_released_sets(tmp_path: Path):
    from bayesncl.app.evaluate import load_trained
    from bayesncl.app.ood import ood_evaluate

    root = image_folder(tmp_path / "data")
    for c in ("cat", "dog"):
        _images(root / "imagenet-c" / "fog" / "1" / c)
        _images(root / "imagenet-sketch" / c)
    data = ["data.name=imagefolder", f"data.root={root}", "data.train_subset=0", "data.test_subset=0"]
    ckpt = tiny_checkpoint(tmp_path / "m.pt", data, num_classes=2)
    model, cfg, _ = load_trained(ckpt)
    r = ood_evaluate(model, cfg, severities=(1,))
    assert set(r["corruptions"]) == {"fog"} and 0 <= r["corruptions"]["fog"]["1"] <= 100
    assert 0 <= r["sketch_acc1"] <= 100 and "stylized_acc1" not in r


def test_ood_command_writes_the_table_and_figure(tmp_path: Path, capsys):
    ckpt = tiny_checkpoint(tmp_path / "m.pt", [])
    args = ["ood", str(ckpt), "--corruptions", "contrast,gaussian_noise", "--severities", "1,5",
            "--cache", str(tmp_path / "cache")]
    assert main(args) == 0
    r = json.loads((tmp_path / "ood.json").read_text())
    assert set(r["corruptions"]) == {"contrast", "gaussian_noise"} and set(r["severity_mean"]) == {"1", "5"}
    assert r["corruption_mean"] == pytest.approx(np.mean([v for row in r["corruptions"].values()
                                                          for v in row.values()]))
    assert (tmp_path / "ood.png").is_file() and "| contrast |" in (tmp_path / "ood.md").read_text()


def test_ood_bad_inputs_write_nothing(tmp_path: Path, capsys):
    ckpt = tiny_checkpoint(tmp_path / "m.pt", [])
    assert main(["ood", str(ckpt), "--corruptions", "fgo", "--cache", str(tmp_path / "cache")]) == 2
    expect("V7", error_line(capsys), tmp_path)
    assert main(["ood", str(ckpt), "--severities", "6", "--cache", str(tmp_path / "cache")]) == 2
    expect("V8", error_line(capsys), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]
