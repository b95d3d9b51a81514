"""The authors' augmentation presets (``data.augment``, issue 47 item 4): their parameters against the
authors' YAML files, the two views' pipelines and their shapes, solarization's analytic result, and
the default left as it was.

Values hard-coded from PKU-ML/non_neg (Cui-Peng-624/BayesNCL holds the same files):
``scripts/pretrain/imagenet-100/asymmetric.yaml`` (two pipelines, ``num_crops: 1`` each),
``scripts/pretrain/cifar/symmetric_weak.yaml``, ``scripts/pretrain/imagenet-100/symmetric_weak.yaml``
and ``scripts/pretrain/{cifar,imagenet-100}/augmentations/symmetric.yaml`` (our default).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bayesncl.app.cli import main
from bayesncl.config import ConfigError, build_config
from bayesncl.data import build_train_loader
from bayesncl.data.augment import (
    AUGMENT_PRESETS,
    AugmentSpec,
    BatchAugment,
    mix_seed,
    preset_views,
    sample_transform,
    seeded,
)
from bayesncl.data.loaders import _epoch_order, augment_spec, augment_views

from ..conftest import TINY_BASE, expect

RGB = AugmentSpec.simclr(32, 3, (0.5,) * 3, (0.25,) * 3)
FIELDS = ("crop_min_scale", "jitter_p", "brightness", "contrast", "saturation", "hue", "gray_p", "blur_p",
          "solarize_p", "flip_p")  # fmt: skip


def _values(spec: AugmentSpec) -> tuple[float, ...]:
    return tuple(getattr(spec, f) for f in FIELDS)


def test_presets_hold_the_authors_yaml_values() -> None:
    # rrc.crop_min_scale, color_jitter.{prob, brightness, contrast, saturation, hue}, grayscale.prob,
    # gaussian_blur.prob, solarization.prob, horizontal_flip.prob, in the files' order
    symmetric = (0.08, 0.8, 0.8, 0.8, 0.8, 0.2, 0.2, 0.5, 0.0, 0.5)  # augmentations/symmetric.yaml
    asym1 = (0.08, 0.8, 0.4, 0.4, 0.2, 0.1, 0.2, 1.0, 0.0, 0.5)  # asymmetric.yaml, first pipeline
    asym2 = (0.08, 0.8, 0.4, 0.4, 0.2, 0.1, 0.2, 0.1, 0.2, 0.5)  # asymmetric.yaml, second pipeline
    weak_cifar = (0.2, 0.4, 0.4, 0.4, 0.4, 0.1, 0.2, 0.5, 0.0, 0.5)  # cifar/symmetric_weak.yaml
    weak_imagenet = (0.08, 0.8, 0.4, 0.4, 0.4, 0.1, 0.2, 0.5, 0.0, 0.5)  # imagenet-100/symmetric_weak.yaml
    assert tuple(map(_values, preset_views(RGB, "default", "cifar10"))) == (symmetric, symmetric)
    assert tuple(map(_values, preset_views(RGB, "asymmetric", "imagefolder"))) == (asym1, asym2)
    assert tuple(map(_values, preset_views(RGB, "symmetric-weak-cifar", "x"))) == (weak_cifar, weak_cifar)
    assert tuple(map(_values, preset_views(RGB, "symmetric-weak-imagenet", "x"))) == (weak_imagenet,) * 2
    # symmetric-weak picks the file by dataset
    weak = preset_views(RGB, "symmetric-weak", "cifar100")
    assert weak == preset_views(RGB, "symmetric-weak-cifar", "")
    weak = preset_views(RGB, "symmetric-weak", "imagefolder")
    assert weak == preset_views(RGB, "symmetric-weak-imagenet", "")
    for a, b in (preset_views(RGB, name, "cifar10") for name in AUGMENT_PRESETS):  # every file: sigma, size
        assert a.blur_sigma == b.blur_sigma == (0.1, 2.0)
        assert (a.size, a.mean) == (b.size, b.mean) == (32, RGB.mean)
    gray = AugmentSpec.simclr(28, 1, (0.5,), (0.25,))
    v1, v2 = preset_views(gray, "asymmetric", "fashion-mnist")  # one channel: no saturation, hue, grayscale
    assert (v1.saturation, v1.hue, v1.gray_p, v2.solarize_p) == (0.0, 0.0, 0.0, 0.2)
    with pytest.raises(ValueError, match="data.augment='strong'"):
        preset_views(RGB, "strong", "cifar10")


def test_the_default_is_the_spec_it_was() -> None:
    cfg = build_config(overrides=TINY_BASE)
    assert cfg.data.augment == "default"
    v1, v2 = augment_views(cfg.data)
    assert v1 == v2 == augment_spec(cfg.data)
    loader = build_train_loader(cfg.data, 16, seed=0, device=torch.device("cpu"))
    assert loader.augment2 is None and loader.spec2 == loader.spec
    # the batches as before: ONE call on the 2B stacked copies under the step's seed
    loader.set_epoch(0)
    x1, x2, _ = next(iter(loader))
    idx = _epoch_order(loader.n, 0, 0, 0, 1)[:16]
    x = loader.images[idx].float().div_(255.0)
    with seeded(mix_seed(0, 0, 0, 0)):
        views = BatchAugment(v1)(torch.cat([x, x]))
    assert torch.equal(x1, views[:16]) and torch.equal(x2, views[16:])


@pytest.mark.parametrize("resident", ["true", "false"])
def test_asymmetric_views_have_their_own_pipelines_and_shapes(resident: str) -> None:
    cfg = build_config(overrides=[*TINY_BASE, "data.augment=asymmetric", f"data.resident={resident}"])
    loader = build_train_loader(cfg.data, 8, seed=0, device=torch.device("cpu"))
    assert (loader.spec.blur_p, loader.spec.solarize_p, loader.spec2.blur_p, loader.spec2.solarize_p) == (
        1.0, 0.0, 0.1, 0.2)
    loader.set_epoch(0)
    x1, x2, y = next(iter(loader))
    assert x1.shape == x2.shape == (8, 3, 16, 16) and y.shape == (8,) and x1.dtype == torch.float32
    assert not torch.equal(x1, x2)
    loader.set_epoch(0)
    again = next(iter(loader))
    assert torch.equal(again[0], x1) and torch.equal(again[1], x2)  # seeded as every loader
    probe = build_train_loader(cfg.data, 8, seed=0, device=torch.device("cpu"), crop_flip_only=True)
    assert probe.spec == probe.spec2 and (probe.spec.blur_p, probe.spec.solarize_p) == (0.0, 0.0)


def _identity_spec(size: int, channels: int, solarize_p: float) -> AugmentSpec:
    """Every random step off but solarization; a full-image crop (scale 1, ratio 1): the identity."""
    return AugmentSpec(size, channels, (0.0,) * channels, (1.0,) * channels, crop_min_scale=1.0,
                       crop_ratio=(1.0, 1.0), jitter_p=0.0, gray_p=0.0, blur_p=0.0, flip_p=0.0,
                       solarize_p=solarize_p)  # fmt: skip


def test_solarization_with_p_1_is_the_analytic_result() -> None:
    """PIL's solarize at 128: v >= 128 -> 255 - v, below unchanged, on a hand-made 4x4 image."""
    img = np.array([[0, 50, 127, 128], [129, 200, 255, 10], [128, 127, 64, 192], [1, 254, 100, 150]],
                   dtype=np.uint8)  # fmt: skip
    expected = np.where(img >= 128, 255 - img.astype(np.int64), img).astype(np.float32) / 255.0
    assert expected[0].tolist() == pytest.approx([0.0, 50 / 255, 127 / 255, 127 / 255])
    per_image = sample_transform(_identity_spec(4, 1, 1.0))(Image.fromarray(img, mode="L"))
    assert per_image.shape == (1, 4, 4)
    assert np.allclose(per_image[0].numpy(), expected, atol=1e-6)
    batched = BatchAugment(_identity_spec(4, 1, 1.0))(torch.from_numpy(img)[None, None].float() / 255.0)
    assert batched.shape == (1, 1, 4, 4)
    assert np.allclose(batched[0, 0].numpy(), expected, atol=1e-5)
    untouched = BatchAugment(_identity_spec(4, 1, 0.0))(torch.from_numpy(img)[None, None].float() / 255.0)
    assert np.allclose(untouched[0, 0].numpy(), img / 255.0, atol=1e-5)


def test_a_preset_refuses_the_default_only_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="data.crop_min_scale=0.2 / data.blur_prob=0.5 apply to data"):
        build_config(overrides=["data.augment=symmetric-weak", "data.crop_min_scale=0.2"])
    run = tmp_path / "r"
    assert main(["pretrain", "--run-dir", str(run), "data.augment=asymmetric", "data.blur_prob=0.3"]) == 2
    expect("C21", capsys.readouterr().err, tmp_path)
    assert not run.exists()
    with pytest.raises(ConfigError, match="data.augment='weak': expected one of default, asymmetric"):
        build_config(overrides=["data.augment=weak"])
