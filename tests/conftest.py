"""What the tests share: tiny CPU settings (synthetic 16 px images, a small CNN, a few steps per
epoch), a tiny untrained checkpoint, a small image folder, and the one-line error check.

Test modules import the helpers (``from .conftest import TINY_BASE``); each adds its own
``train.epochs`` where it needs another than :data:`TINY`'s one epoch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

TINY_BASE = [
    "data.name=synthetic",
    "data.train_subset=96",
    "data.test_subset=60",
    "data.image_size=16",
    "model.backbone=small_cnn",
    "model.proj_hidden=32",
    "model.proj_dim=16",
    "train.batch_size=32",
    "train.warmup_epochs=1",
    "train.progress=false",
    "train.device=cpu",
    "eval.batch_size=64",
    "train.checkpoint_every=1",  # epoch-NNNN.pt every epoch, as `dynamics` and the resume tests expect
]
TINY = [*TINY_BASE, "train.epochs=1"]
ERROR = "bayesncl: error: "


def tiny_checkpoint(path: Path, overrides: list[str], channels: int = 3, num_classes: int = 10) -> Path:
    """A bayesncl checkpoint of an untrained tiny model for ``TINY_BASE + overrides`` (16 px images):
    enough for ``extract`` and ``evaluate``, without training."""
    import torch

    from bayesncl.config import build_config
    from bayesncl.core.model import build_model

    cfg = build_config(overrides=[*TINY_BASE, "train.epochs=1", *overrides])
    model = build_model(cfg, channels, 16, num_classes)
    ckpt = {"format": "bayesncl-checkpoint-v1", "config": cfg.to_dict(), "state_dict": model.state_dict()}
    torch.save(ckpt, path)
    return path


def image_folder(root: Path, classes: tuple[str, ...] = ("cat", "dog"), n: int = 20) -> Path:
    """An ImageFolder dataset under ``root``: ``n`` random 20 px RGB images per class in train/, 6 in val/."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", n), ("val", 6)):
        for c in classes:
            d = root / split / c
            d.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(d / f"{i}.png")
    return root


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """What the command wrote to stderr: exactly one line ``bayesncl: error: ...`` (returned stripped)."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n") and err.startswith(ERROR), err
    return err.strip()

