"""The SimCLR two-view augmentation (PAPER-NOTES §2), as ONE specification with two executors.

:class:`AugmentSpec` holds the distribution; it is executed either

* batched on the device by :class:`BatchAugment` (kornia, per-sample random parameters): the
  *resident* path, used for small tensor datasets held as one uint8 tensor; or
* per image by :func:`sample_transform` (torchvision.transforms.v2 on PIL images): the
  *per-sample* DataLoader path, used for image folders and ``data.resident=false``.

The pipeline, in order:

1. RandomResizedCrop to ``size`` x ``size``, area scale U(``crop_min_scale``, 1), aspect ratio
   log-uniform in (3/4, 4/3);
2. colour jitter with p 0.8: brightness 0.8, contrast 0.8, saturation 0.8, hue 0.2 (torchvision's
   formulas: a factor ``b`` draws from [max(0, 1-b), 1+b], hue from [-h, h]);
3. grayscale with p 0.2;
4. Gaussian blur with p ``blur_prob``, sigma U(0.1, 2.0): PIL's ``GaussianBlur(radius=sigma)``, as
   the authors' loader (solo/data/pretrain_dataloader.py:77-100; CIFAR too), i.e. three extended
   box blurs of variance sigma²/3 each (:func:`pil_box_kernels`), so the blur grows with sigma;
5. solarization with p ``solarize_p`` (0 by default; PIL's ``ImageOps.solarize``, threshold 128);
6. horizontal flip with p 0.5;
7. normalisation with the dataset mean/std.

``data.augment`` picks one of :data:`AUGMENT_PRESETS`, the authors' YAML files: ``default`` (their
``symmetric.yaml``: the values above), ``asymmetric`` (two different pipelines for view 1 and view 2,
solo-learn style), ``symmetric-weak`` (weaker colour jitter); :func:`preset_views` gives the two views'
specs. The loaders run one spec for both views when they are equal (so the default's batches are
unchanged) and each view's own otherwise.

Gray (1-channel) data such as Fashion-MNIST keeps its single channel: the colour jitter reduces
to brightness + contrast, and saturation, hue and the grayscale step are skipped (they are
identities on gray images, and the RGB formulas do not apply to one channel).

Known differences between the two executors (same distribution of parameters otherwise):

* kornia draws ONE random order of the four jitter steps per call (the resident loader makes one
  call per step for both views), torchvision one per image; the factors are drawn per image in
  both;
* kornia crops by one batched bilinear warp of the float tensor (no antialias), torchvision
  resizes the PIL crop (bilinear with antialias); ``data.crop_interpolation=bicubic`` (the authors'
  pretraining crop) makes both bicubic, kornia's result clamped to [0, 1] as PIL's uint8 is, and
  kornia's warp pads with zeros, so a bicubic crop touching the image border differs from PIL's in
  its outermost pixels (up to ~0.1 on a mid-gray image; inside, the same to 1e-6); the blur runs on
  float tensors (PIL's kernel,
  edges replicated) vs PIL's own filter on the uint8 image (which rounds after each box pass).

Randomness: both executors draw from the *global* torch RNG, so callers wrap them in
``torch.random.fork_rng`` + an explicit seed (:func:`seeded`, :mod:`bayesncl.data.loaders`); kornia samples
its parameters on the CPU (its default), so the augmentation parameters for a given seed are the
same on CPU and CUDA.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

# the seed mixer lives in the core (its rank seeds use it too); the data imports it from there
from bayesncl.core.seeding import mix_seed as mix_seed


@contextlib.contextmanager
def seeded(seed: int, device: torch.device | str | None = None) -> Iterator[None]:
    """Run a block with the global torch RNG seeded to ``seed``; restore the caller's RNG after.

    Forks the CPU generator and, for a CUDA ``device``, that device's generator only (seeding it
    without touching the other devices), so the training loop's RNG stream is not disturbed.
    """
    dev = torch.device(device or "cpu")
    cuda = [torch.cuda.current_device() if dev.index is None else dev.index] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.random.default_generator.manual_seed(seed)
        for index in cuda:
            with torch.cuda.device(index):
                torch.cuda.manual_seed(seed)
        yield


_BLUR_PASSES = 3  # Pillow's ImagingGaussianBlur: three box passes


def _box_radius(sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer part l and fractional weight a of the extended box whose variance is sigma²/3
    (Gwosdek et al. 2011, the formula of Pillow's BoxBlur.c)."""
    s2 = sigma.double() ** 2 / _BLUR_PASSES
    l = torch.floor((torch.sqrt(12 * s2 + 1) - 1) / 2)  # noqa: E741 - the paper's name
    return l, (2 * l + 1) * (l * (l + 1) - 3 * s2) / (6 * (s2 - (l + 1) ** 2))


def pil_box_kernels(sigma: torch.Tensor, sigma_max: float) -> torch.Tensor:
    """The box of PIL's ``GaussianBlur(radius=sigma)``, which blurs each axis three times with it:
    an extended box of variance sigma²/3 (total variance sigma²). sigma: (B,) in (0, sigma_max].
    Returns (B, 2R + 1) float64 kernels summing to 1 on sigma's device, R = the box support at sigma_max (5
    taps at 2)."""
    r = int(_box_radius(torch.tensor([float(sigma_max)]))[0]) + 1
    l, a = _box_radius(sigma)
    k = torch.arange(-r, r + 1, dtype=torch.float64, device=sigma.device).abs()
    box = (k <= l[:, None]).double() + a[:, None] * (k == l[:, None] + 1)
    return box / (2 * l + 1 + 2 * a)[:, None]


class _PilBlur(nn.Module):
    """Batched PIL-equivalent Gaussian blur: per sample, with p ``p``, sigma ~ U(lo, hi) drawn
    from the global CPU RNG (as kornia draws its parameters); edges replicated as PIL does.

    On a CPU the chosen rows alone are blurred (:meth:`_host`, the digits of every CPU run). On another
    device (CUDA) the draws go over in one pinned, non-blocking copy and the kernels are built there
    (:meth:`_on_device`): every row is blurred and the unchosen ones keep their pixels, so the step
    waits for nothing on the host (the host path's kernel and row-index copies were 2 synchronisations
    per step on an H200, docs/scaling.md). Same draws, same result to fp32 rounding."""

    def __init__(self, sigma: tuple[float, float], p: float) -> None:
        super().__init__()
        self.sigma, self.p = sigma, p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        chosen = torch.rand(b) < self.p
        sigma = torch.empty(b, dtype=torch.float64).uniform_(*self.sigma)
        if not chosen.any():  # a CPU tensor: no device synchronisation
            return x
        return self._host(x, chosen, sigma) if x.device.type == "cpu" else self._on_device(x, chosen, sigma)

    def _host(self, x: torch.Tensor, chosen: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """Blur the ``chosen`` rows of ``x`` with kernels built on the host."""
        c = x.shape[1]
        box = pil_box_kernels(sigma[chosen], self.sigma[1]).to(x).repeat_interleave(c, 0)
        idx = chosen.nonzero()[:, 0].to(x.device)
        return x.index_copy(0, idx, self._blur(x[idx], box))

    def _on_device(self, x: torch.Tensor, chosen: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """Blur every row of ``x`` with kernels built on its device, keep the ``chosen`` ones: no host
        synchronisation (``chosen``, ``sigma``: (B,) CPU draws, copied once, pinned on CUDA)."""
        draws = torch.stack([chosen.double(), sigma])
        draws = (draws.pin_memory() if x.is_cuda else draws).to(x.device, non_blocking=True)
        box = pil_box_kernels(draws[1], self.sigma[1]).to(x.dtype).repeat_interleave(x.shape[1], 0)
        return torch.where(draws[0].bool()[:, None, None, None], self._blur(x, box), x)

    @staticmethod
    def _blur(x: torch.Tensor, box: torch.Tensor) -> torch.Tensor:
        """x: (n, C, H, W); box: (n * C, 2R + 1) kernels, one per (sample, channel), on x's device."""
        n, c, h, w = x.shape
        r, g = box.shape[1] // 2, len(box)
        pad, conv = nn.functional.pad, nn.functional.conv2d
        y = x.reshape(1, -1, h, w)  # one group per (sample, channel)
        for _ in range(_BLUR_PASSES):  # as PIL: three passes along rows, then three along columns,
            y = conv(pad(y, (r, r, 0, 0), mode="replicate"), box[:, None, None], groups=g)  # each
        for _ in range(_BLUR_PASSES):  # pass replicating the edge pixels
            y = conv(pad(y, (0, 0, r, r), mode="replicate"), box[:, None, :, None], groups=g)
        return y.reshape(n, c, h, w)


class _PilBlurImage:
    """Per-image blur: PIL's own ``GaussianBlur(radius=sigma)``, sigma ~ U(lo, hi) from the torch RNG."""

    def __init__(self, sigma: tuple[float, float]) -> None:
        self.sigma = sigma

    def __call__(self, img):  # PIL image -> PIL image
        from PIL import ImageFilter

        s = float(torch.empty((), dtype=torch.float64).uniform_(*self.sigma))
        return img.filter(ImageFilter.GaussianBlur(radius=s))


#: PIL's ``ImageOps.solarize`` default threshold (uint8 pixel units), the authors' ``Solarization``
#: (solo/data/pretrain_dataloader.py): a value v >= 128 becomes 255 - v.
SOLARIZE_THRESHOLD = 128


class _Solarize(nn.Module):
    """Batched solarization of float images in [0, 1]: per sample with p ``p`` (drawn from the global
    CPU RNG), x becomes 1 - x where it rounds to a uint8 value >= 128 (x >= 127.5/255: PIL's threshold
    on the uint8 image, robust to the crop's float round-off at 128/255)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chosen = (torch.rand(x.shape[0]) < self.p).to(x.device)[:, None, None, None]
        flipped = torch.where(x >= (SOLARIZE_THRESHOLD - 0.5) / 255.0, 1.0 - x, x)
        return torch.where(chosen, flipped, x)


@dataclass(frozen=True)
class AugmentSpec:
    """One SimCLR augmentation distribution (defaults = PAPER-NOTES §2).

    ``size``: output side S; ``channels``: 1 (gray) or 3; ``mean``/``std``: per-channel
    normalisation. A probability of 0 disables a step. Use :meth:`simclr` to build the paper's
    spec for a dataset.
    """

    size: int
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_min_scale: float = 0.08
    crop_ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    jitter_p: float = 0.8
    brightness: float = 0.8
    contrast: float = 0.8
    saturation: float = 0.8
    hue: float = 0.2
    gray_p: float = 0.2
    blur_p: float = 0.5
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    flip_p: float = 0.5
    interpolation: str = "bilinear"  # the crop's resampling: bilinear | bicubic (the authors' pretraining)
    solarize_p: float = 0.0  # PIL's ImageOps.solarize (threshold 128: v >= 128 -> 255 - v), after the blur

    @classmethod
    def simclr(
        cls, size: int, channels: int, mean: Sequence[float], std: Sequence[float],
        crop_min_scale: float = 0.08, blur_prob: float = 0.5, interpolation: str = "bilinear",
    ) -> AugmentSpec:
        """The paper's two-view distribution; gray data drops saturation, hue and grayscale (they are
        identities on one channel)."""
        spec = cls(int(size), int(channels), tuple(float(m) for m in mean), tuple(float(s) for s in std),
                   crop_min_scale=float(crop_min_scale), blur_p=float(blur_prob), interpolation=interpolation)
        return replace(spec, saturation=0.0, hue=0.0, gray_p=0.0) if spec.channels == 1 else spec


class BatchAugment(nn.Module):
    """The spec executed on a batch with kornia: float ``(B, C, H, W)`` in [0, 1] → normalised
    ``(B, C, S, S)``. Every sample gets its own random parameters; randomness comes from the global
    torch RNG (wrap calls in :func:`seeded`)."""

    def __init__(self, spec: AugmentSpec) -> None:
        super().__init__()
        import kornia.augmentation as K

        self.spec = spec
        s = spec.size
        # cropping_mode="resample": one batched warp (grid_sample). The default "slice" mode loops over
        # the samples in Python (one interpolate per image), which made a 2x256 batch cost ~30 ms on a GPU.
        crop = K.RandomResizedCrop(
            (s, s), scale=(spec.crop_min_scale, 1.0), ratio=spec.crop_ratio, cropping_mode="resample",
            resample=spec.interpolation.upper(),
        )
        ops: list[nn.Module] = [crop]
        if spec.interpolation == "bicubic":  # bicubic overshoots [0, 1]; PIL's uint8 result is clamped
            ops.append(nn.Hardtanh(0.0, 1.0))  # a clamp to [0, 1]
        if spec.jitter_p > 0:
            ops.append(K.ColorJitter(spec.brightness, spec.contrast, spec.saturation, spec.hue,
                                     p=spec.jitter_p))
        if spec.gray_p > 0 and spec.channels == 3:
            ops.append(K.RandomGrayscale(p=spec.gray_p))
        if spec.blur_p > 0:
            ops.append(_PilBlur(spec.blur_sigma, spec.blur_p))
        if spec.solarize_p > 0:
            ops.append(_Solarize(spec.solarize_p))
        if spec.flip_p > 0:
            ops.append(K.RandomHorizontalFlip(p=spec.flip_p))
        self.ops = nn.Sequential(*ops)
        # Plain attributes, not buffers: ``.to(device)`` is never needed (kornia keeps sampling its
        # parameters on the CPU, so a seed gives the same augmentation parameters on every device).
        self._stats: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def _mean_std(self, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        key = (ref.device, ref.dtype)
        if key not in self._stats:
            shape = (1, self.spec.channels, 1, 1)
            mean = torch.tensor(self.spec.mean, dtype=ref.dtype).view(shape).to(ref.device)
            std = torch.tensor(self.spec.std, dtype=ref.dtype).view(shape).to(ref.device)
            self._stats[key] = (mean, std)
        return self._stats[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.ops(x)
        mean, std = self._mean_std(out)
        return (out - mean) / std


# ----------------------------------------------------------------------------- the authors' presets
# Each preset is the two views' parameters as the authors' YAML files give them (PKU-ML/non_neg and
# Cui-Peng-624/BayesNCL hold the same files), on top of :meth:`AugmentSpec.simclr` (size, channels and
# normalisation stay the dataset's; the blur's sigma range U(0.1, 2) and flip p 0.5 are theirs in every
# file). Keys not listed keep the default (= their symmetric.yaml).
_WEAK_CIFAR = {  # scripts/pretrain/cifar/symmetric_weak.yaml
    "crop_min_scale": 0.2, "jitter_p": 0.4, "brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1,
    "gray_p": 0.2, "blur_p": 0.5, "solarize_p": 0.0,
}
_WEAK_IMAGENET = {  # scripts/pretrain/imagenet-100/symmetric_weak.yaml
    "crop_min_scale": 0.08, "jitter_p": 0.8, "brightness": 0.4, "contrast": 0.4, "saturation": 0.4,
    "hue": 0.1, "gray_p": 0.2, "blur_p": 0.5, "solarize_p": 0.0,
}
_ASYMMETRIC = (  # scripts/pretrain/imagenet-100/asymmetric.yaml: its two pipelines, one crop each
    {"crop_min_scale": 0.08, "jitter_p": 0.8, "brightness": 0.4, "contrast": 0.4, "saturation": 0.2,
     "hue": 0.1, "gray_p": 0.2, "blur_p": 1.0, "solarize_p": 0.0},
    {"crop_min_scale": 0.08, "jitter_p": 0.8, "brightness": 0.4, "contrast": 0.4, "saturation": 0.2,
     "hue": 0.1, "gray_p": 0.2, "blur_p": 0.1, "solarize_p": 0.2},
)  # fmt: skip
#: ``data.augment`` → (view 1's, view 2's) parameters, or None for the ``symmetric-weak`` that picks
#: its file by dataset (:func:`preset_views`). ``default`` sets nothing: ``data.crop_min_scale`` and
#: ``data.blur_prob`` apply (the authors' symmetric.yaml at their defaults).
AUGMENT_PRESETS: dict[str, tuple[dict[str, float], dict[str, float]] | None] = {
    "default": ({}, {}),
    "asymmetric": _ASYMMETRIC,
    "symmetric-weak": None,
    "symmetric-weak-cifar": (_WEAK_CIFAR, _WEAK_CIFAR),
    "symmetric-weak-imagenet": (_WEAK_IMAGENET, _WEAK_IMAGENET),
}
#: The datasets whose ``symmetric-weak`` is CIFAR's file (every other one takes ImageNet-100's).
CIFAR_FAMILY: tuple[str, ...] = ("cifar10", "cifar100")


def preset_views(base: AugmentSpec, preset: str, dataset: str) -> tuple[AugmentSpec, AugmentSpec]:
    """The two views' specs of ``data.augment=preset`` on ``dataset`` (a ``data.name``), from ``base``
    (:meth:`AugmentSpec.simclr` of the data): its parameters replaced by the preset's, then gray data's
    rule (saturation, hue, grayscale off on one channel). ``default``: ``(base, base)``. Raises
    ValueError for an unknown preset (the config layer refuses it first)."""
    if preset not in AUGMENT_PRESETS:
        raise ValueError(f"data.augment={preset!r}: expected one of {', '.join(AUGMENT_PRESETS)}")
    views = AUGMENT_PRESETS[preset]
    if views is None:
        family = "cifar" if dataset in CIFAR_FAMILY else "imagenet"
        views = AUGMENT_PRESETS[f"symmetric-weak-{family}"]
    assert views is not None
    out = []
    for params in views:
        spec = replace(base, **params)
        out.append(replace(spec, saturation=0.0, hue=0.0, gray_p=0.0) if spec.channels == 1 else spec)
    return out[0], out[1]


def sample_transform(spec: AugmentSpec):  # -> torchvision.transforms.v2.Compose
    """The spec executed per image with torchvision.transforms.v2: PIL image (or uint8 CHW tensor)
    → normalised float ``(C, S, S)``. Randomness comes from the global torch RNG."""
    from torchvision.transforms import v2 as T

    scale = (spec.crop_min_scale, 1.0)
    mode = T.InterpolationMode(spec.interpolation)
    ts: list = [
        T.RandomResizedCrop(spec.size, scale=scale, ratio=spec.crop_ratio, interpolation=mode, antialias=True)
    ]
    if spec.jitter_p > 0:
        if spec.channels == 1:
            jitter = T.ColorJitter(brightness=spec.brightness, contrast=spec.contrast)
        else:
            jitter = T.ColorJitter(spec.brightness, spec.contrast, spec.saturation, spec.hue)
        ts.append(T.RandomApply([jitter], p=spec.jitter_p))
    if spec.gray_p > 0 and spec.channels == 3:
        ts.append(T.RandomGrayscale(p=spec.gray_p))
    if spec.blur_p > 0:
        ts.append(T.RandomApply([_PilBlurImage(spec.blur_sigma)], p=spec.blur_p))
    if spec.solarize_p > 0:  # on the PIL / uint8 image: threshold in pixel units, as ImageOps.solarize
        ts.append(T.RandomSolarize(SOLARIZE_THRESHOLD, p=spec.solarize_p))
    if spec.flip_p > 0:
        ts.append(T.RandomHorizontalFlip(p=spec.flip_p))
    ts += [T.ToImage(), T.ToDtype(torch.float32, scale=True), T.Normalize(list(spec.mean), list(spec.std))]
    return T.Compose(ts)


def eval_folder_transform(size: int, mean: Sequence[float] | None, std: Sequence[float] | None):
    """Deterministic geometry for variable-size folder images: resize the shorter side to
    ``round(size * 256 / 224)`` then centre-crop ``size`` (the standard ImageNet evaluation
    protocol). With ``mean``/``std`` → normalised float ``(C, S, S)``; without → uint8 ``(C, S, S)``."""
    from torchvision.transforms import v2 as T

    ts: list = [T.Resize(round(size * 256 / 224), antialias=True), T.CenterCrop(size), T.ToImage()]
    if mean is not None and std is not None:
        ts += [T.ToDtype(torch.float32, scale=True), T.Normalize(list(mean), list(std))]
    return T.Compose(ts)
