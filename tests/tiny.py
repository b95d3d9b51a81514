"""Tiny CPU settings shared by the end-to-end tests: synthetic 16 px images, a small CNN, a few
steps per epoch. Each test module adds its own ``train.epochs``."""

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
]
