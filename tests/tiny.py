"""Tiny CPU settings shared by the end-to-end tests: synthetic 16 px images, a small CNN, a few
steps per epoch. Each test module adds its own ``train.epochs``."""

from __future__ import annotations

from pathlib import Path

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
    "train.checkpoint_every=1",  # epoch-NNNN.pt every epoch, as `dynamics` and the resume tests expect
    "train.device=cpu",
    "eval.batch_size=64",
]


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
