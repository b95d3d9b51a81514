"""``bayesncl benchmark``: training throughput of CL, NCL and BayesNCL from one run.

What one *step* is: exactly the training loop's step (:func:`bayesncl.core.engine.train_step`): the
next batch from the training loader (both views augmented), forward, InfoNCE + λ·KL + online
probe, backward, LARS step. An *image* is one source image, i.e. one two-view pair (a batch of
256 is 512 augmented views). Data: the built-in synthetic 32×32 RGB set (``data.name=synthetic``),
resized to ``--image-size``; nothing is downloaded.

Measured, in ONE process and ONE run so the ratios are fair on a noisy machine:

* ``images_per_s`` {cl, ncl, bayesncl}: the arms run in rounds, ``--steps`` steps each, in an
  order shuffled every round (seeded; no arm keeps one predecessor); each figure is the median over
  rounds. On CPU a round is one step per arm, so that the arms compared in a round saw the same load
  from other processes.
* ``gate_overhead_pct``: the median over rounds of BayesNCL's step time over NCL's, minus 1, in %
  (the paper reports +5.9 % wall time on CIFAR-100).
* ``flops_per_image`` {ncl, bayesncl}: forward FLOPs of one image (one view) through the model,
  from ``torch.utils.flop_counter.FlopCounterMode`` (the paper's Table 7 convention), and
  ``train_flops_per_pair``: forward + backward of a whole training step per two-view pair (what
  ``images_per_s`` counts); see :func:`flops_per_image`. ``gate_flops_pct`` compares the latter.
* ``augment_speedup``: the same BayesNCL model trained from the batched on-device augmentation
  (``data.resident=true``, kornia) against the per-sample torchvision/PIL DataLoader path
  (``data.resident=false``, ``--workers`` workers): the ratio of their images/s, median over rounds.
* ``augment_only_speedup``: the two loaders alone, without a model (the data path's own ratio).
* ``heldout_monitor_s`` / ``heldout_monitor_pct_of_demo_epoch``: at the demo's settings (the
  ``fashion-mnist-demo`` recipe's BayesNCL model, 28 px, batch 256, fp32, on synthetic images), one
  epoch-end measurement of the held-out batch (:mod:`bayesncl.app.heldout`, the default 2,000
  images) and its share of a demo epoch (the recipe's 20,000 train images at the images/s of that
  recipe's training step, timed in the same rounds): the bound is 5 % (issue 16).
* ``speedup_vs_plain_simclr`` {default, fp32, bf16}: {cl, ncl, bayesncl}: our step against a plain
  SimCLR loop of the kind lightly's and torchvision's examples show (:mod:`bayesncl.paper.plain_simclr`:
  the same backbone, projector and InfoNCE; a DataLoader with per-sample torchvision transforms;
  fp32; the best of 0, 1 and 2 workers), timed in the same rounds: the median over rounds of its
  step time over ours, with our step at the run's precision (``default``), at fp32, and at bf16
  autocast + channels-last where the device computes bf16 natively (``bf16``; a CPU with
  AVX512-BF16 or AMX, or CUDA). ``plain_simclr`` holds that loop's images/s, best and by workers;
  ``images_per_s_by_precision`` ours. ``--no-plain-compare`` skips them.
* ``breakdown``: each loader alone, and the BayesNCL step on a fixed batch alone (to see which
  part limits the step); on CUDA also BayesNCL without :func:`bayesncl.core.engine.prefetch_to_device`
  (the loader on the main stream).

Defaults: CPU: ResNet-18 with the ImageNet stem, 32 px, batch 64, ``train.precision=auto`` as
training (bf16 autocast + channels-last on a CPU with native bf16, fp32 on others; ``--precision
fp32`` for the fp32 figures recorded before, about 25 s on 2 idle cores, up to a minute on busy
ones); CUDA: ResNet-18 with the CIFAR stem, batch 256, 32 px, bf16 autocast, channels_last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from bayesncl.app.timing import endless as _endless
from bayesncl.app.timing import sync as _sync
from bayesncl.app.timing import trainer as _trainer
from bayesncl.config import Config, ConfigError, build_config

if TYPE_CHECKING:  # torch and the training code load only when a benchmark runs (fast CLI start-up)
    import torch

__all__ = [
    "BenchmarkSettings", "add_benchmark_parser", "default_settings", "flops_per_image", "format_report",
    "run_benchmark"
]

METHODS = ("cl", "ncl", "bayesncl")
HELDOUT_TARGET_PCT = 5.0  # the epoch-end held-out monitor, as a share of a demo epoch (issue 16)
GPU_TARGET_IMAGES_PER_S = 11_200  # 200 CIFAR-100 epochs (10 M pairs) in 15 min on one H200
CPU_AUGMENT_TARGET = 2.0
GATE_OVERHEAD_TARGET_PCT = 3.0
PLAIN_TARGET = 1.5  # our default step against the plain SimCLR loop (issue 23)


@dataclass
class BenchmarkSettings:
    """Everything a benchmark run depends on (``None`` fields take the device's default)."""

    device: str = "auto"
    backbone: str = "resnet18"
    cifar_stem: str | None = None  # CPU: false (ImageNet stem); CUDA: true
    image_size: int = 32
    batch_size: int | None = None  # CPU: 64; CUDA: 256
    steps: int | None = None  # timed steps per arm and round; CPU: 1, CUDA: 20
    rounds: int | None = None  # interleaved rounds; CPU: 12, CUDA: 5
    warmup: int = 2  # untimed steps per arm before the first round
    precision: str | None = None  # auto: the training default (bf16 + channels-last on a native-bf16 CPU)
    channels_last: bool | None = None  # CPU: false; CUDA: true
    compile: bool = False
    augment_compare: bool = True  # time the per-sample DataLoader path too
    plain_compare: bool = True  # time a plain SimCLR loop (plain_simclr) and our step at fp32 / bf16 too
    workers: int = 0  # DataLoader workers of the per-sample path
    threads: int = 0  # torch intra-op threads (0: leave as is)
    extra: list[str] = field(default_factory=list)  # more key=value config overrides


# Config keys the benchmark sets itself: the arms (method.name), the two data paths (data.resident) on
# the synthetic set (data.name), and the keys its options set (key -> the BenchmarkSettings field; the
# option is --FIELD, with "-" for "_").
ARM_KEYS = ("method.name", "data.resident", "data.name")
OPTION_KEYS = {
    "data.image_size": "image_size", "data.num_workers": "workers", "model.backbone": "backbone",
    "model.cifar_stem": "cifar_stem", "train.batch_size": "batch_size", "train.precision": "precision",
    "train.channels_last": "channels_last", "train.compile": "compile", "train.device": "device",
}


def default_settings(settings: BenchmarkSettings) -> tuple[BenchmarkSettings, torch.device]:
    """Fill the device-dependent defaults. Raises ConfigError for values out of range, an unknown
    device, or a key=value override of a key the benchmark sets itself (``method.name``, ...)."""
    from bayesncl.config import check_device, refuse_fixed_keys
    from bayesncl.core.distributed import resolve_device

    refuse_fixed_keys(
        settings.extra, ARM_KEYS,
        "the benchmark's arms (cl, ncl, bayesncl on the synthetic set, resident and per-sample data paths)",
    )
    for o in settings.extra:
        key = o.split("=", 1)[0].strip()
        if key in OPTION_KEYS:
            option = "--" + OPTION_KEYS[key].replace("_", "-")
            raise ConfigError(f"{key} is set by benchmark {option}; pass that option instead")
    check_device(settings.device, "benchmark --device")
    for name, value, low in (("--threads", settings.threads, 0), ("--workers", settings.workers, 0),
                             ("--steps", settings.steps, 1), ("--rounds", settings.rounds, 1),
                             ("--warmup", settings.warmup, 0), ("--image-size", settings.image_size, 8),
                             ("--batch-size", settings.batch_size, 2)):  # fmt: skip
        if value is not None and value < low:  # (None: the device's default, in range)
            raise ConfigError(f"benchmark {name}={value}: expected >= {low}")
    cpus = os.cpu_count() or 1
    if settings.threads > cpus:  # torch.set_num_threads(100000) crashed the process (SIGSEGV)
        raise ConfigError(
            f"benchmark --threads={settings.threads}: expected 0 (leave as is) to {cpus} (the CPUs here)"
        )
    device = resolve_device(settings.device, what="benchmark --device")
    cuda = device.type == "cuda"
    defaults = {
        "cifar_stem": "true" if cuda else "false", "batch_size": 256 if cuda else 64,
        "steps": 20 if cuda else 1, "rounds": 5 if cuda else 12, "precision": "auto",
        "channels_last": cuda,
    }
    return replace(settings, **{k: v for k, v in defaults.items() if getattr(settings, k) is None}), device


# ----------------------------------------------------------------------------- one arm
@dataclass
class _Arm:
    """One thing timed in the rounds: a callable doing ``steps`` units of work of ``images`` each."""

    name: str
    run: Callable[[], object]
    images: int
    steps: int
    times: list[float] = field(default_factory=list)  # seconds per step, one entry per round


def _config(s: BenchmarkSettings, method: str, resident: bool) -> Config:
    options = [f"{key}={getattr(s, name)}" for key, name in OPTION_KEYS.items()]
    arms = ["data.name=synthetic", f"data.resident={str(resident).lower()}", f"method.name={method}"]
    return build_config(overrides=[*arms, *options, *s.extra])


def flops_per_image(cfg: Config, *, train: bool = False, batch_size: int | None = None) -> float:
    """FLOPs of the model ``cfg`` describes (``torch.utils.flop_counter.FlopCounterMode``: matmuls
    and convolutions, a multiply-add is 2 FLOPs), counted on the ``meta`` device (no compute).

    ``train=False``: the forward pass of ONE image (one view) through backbone, projector and gate
    (the paper's Table 7 convention; ImageNet-100 ResNet-18: 3.71 G here vs 3.73 G there).
    ``train=True``: a whole training step per two-view pair, forward and backward, at ``batch_size``
    pairs (default ``train.batch_size``; only InfoNCE's similarity matrix grows with the batch).
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from bayesncl.core.engine import TrainForward, forward_loss
    from bayesncl.core.model import build_model
    from bayesncl.data import dataset_info

    info = dataset_info(cfg.data)
    with torch.device("meta"):
        model = build_model(cfg, info.channels, info.image_size, info.num_classes)
    model.train()
    n = batch_size or cfg.train.batch_size
    shape = (n, info.channels, info.image_size, info.image_size)
    x1, x2 = torch.empty(shape, device="meta"), torch.empty(shape, device="meta")
    y = torch.zeros(n, dtype=torch.long, device="meta")
    counter = FlopCounterMode(display=False)
    with counter:
        if train:
            loss, _ = forward_loss(TrainForward(model), x1, x2, y, cfg.method)
            loss.backward()
        else:
            model(x1)
    return counter.get_total_flops() / n


# ----------------------------------------------------------------------------- the run
def _device_name(device: torch.device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{name}, {torch.get_num_threads()} torch threads"


def _median_ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def _arms(s: BenchmarkSettings, device: torch.device, configs: dict[str, Config]) -> list[_Arm]:
    """What the rounds time: each method's step, the loaders alone, the BayesNCL step on a fixed
    batch, the per-sample data path (``s.augment_compare``) and, on CUDA, no prefetch."""
    from bayesncl.data import build_train_loader

    b, steps = int(s.batch_size or 0), int(s.steps or 0)
    trainers = {m: _trainer(configs[m], device) for m in METHODS}
    bayes, bayes_batches, _ = trainers["bayesncl"]
    fixed = next(bayes_batches)
    arms = [_Arm(m, (lambda step=trainers[m][0]: step(None)), b, steps) for m in METHODS]
    data = configs["bayesncl"].data
    aug_batches = _endless(build_train_loader(data, b, seed=1, device=device))
    arms.append(_Arm("augment-only", lambda: next(aug_batches), b, steps))
    if s.augment_compare:  # the same BayesNCL model (same seed), fed by the per-sample DataLoader
        per_sample_cfg = _config(s, "bayesncl", resident=False)
        per_sample, *_ = _trainer(per_sample_cfg, device)
        arms.append(_Arm("bayesncl/per-sample", lambda: per_sample(None), b, min(steps, 3)))
        ps_batches = _endless(build_train_loader(per_sample_cfg.data, b, seed=1, device=device))
        arms.append(_Arm("per-sample-only", lambda: next(ps_batches), b, min(steps, 3)))
    arms.append(_Arm("step-only", lambda: bayes(fixed), b, steps))
    if device.type == "cuda":  # what prefetch_to_device buys: the loader on the main stream
        plain = _endless(build_train_loader(data, b, seed=2, device=device))
        arms.append(_Arm("no-prefetch", lambda: bayes(next(plain)), b, steps))
    if s.plain_compare:
        arms += _plain_arms(s, device, configs["cl"])
    return arms


def _precisions(s: BenchmarkSettings, device: torch.device) -> dict[str, BenchmarkSettings | None]:
    """The precisions our step is compared with the plain loop at, besides the run's own
    (``"default"``: None): ``"fp32"`` always, ``"bf16"`` (autocast + channels-last) where the device
    computes bf16 natively (:func:`bayesncl.core.optim.native_cpu_bf16`, or a CUDA device that
    supports it); None where one is the same as the run's own precision (its arms are reused)."""
    import torch

    from bayesncl.core.optim import native_cpu_bf16, precision_plan

    own = precision_plan(str(s.precision), bool(s.channels_last), device)
    out: dict[str, BenchmarkSettings | None] = {"default": None}
    fp32 = own.dtype is None and not own.channels_last
    out["fp32"] = None if fp32 else replace(s, precision="fp32", channels_last=False)
    native = torch.cuda.is_bf16_supported() if device.type == "cuda" else native_cpu_bf16() is not None
    if native:
        bf16 = own.dtype == torch.bfloat16 and own.channels_last
        out["bf16"] = None if bf16 else replace(s, precision="bf16", channels_last=True)
    return out


def _plain_arms(s: BenchmarkSettings, device: torch.device, cl: Config) -> list[_Arm]:
    """Our three methods at the other :func:`_precisions` (``"{method}@{label}"``) and the plain
    SimCLR loop (:mod:`bayesncl.paper.plain_simclr`, the model of ``cl``) with 0, 1 and 2 DataLoader
    workers (``"plain/w{workers}"``)."""
    from bayesncl.paper.plain_simclr import plain_trainer

    b, steps = int(s.batch_size or 0), int(s.steps or 0)
    arms = []
    for label, other in _precisions(s, device).items():
        for m in METHODS if other is not None else ():
            step, *_ = _trainer(_config(other, m, resident=True), device)
            arms.append(_Arm(f"{m}@{label}", lambda step=step: step(None), b, steps))
    arms += [_Arm(f"plain/w{w}", step, b, steps) for w, step in plain_trainer(cl, device).items()]
    return arms


def _plain_figures(
    s: BenchmarkSettings, device: torch.device, by: dict[str, _Arm], rate: dict[str, float]
) -> dict[str, Any]:
    """``speedup_vs_plain_simclr`` {precision label: {method: x}}: the median over rounds of the
    plain loop's step time (its best worker count) over ours; ``plain_simclr``: that loop's
    images/s (best, and by workers); ``images_per_s_by_precision``."""
    workers = {int(name.split("/w")[1]): r for name, r in rate.items() if name.startswith("plain/w")}
    best = max(workers, key=lambda w: workers[w])
    plain = by[f"plain/w{best}"].times
    arm = {label: "" if other is None else f"@{label}" for label, other in _precisions(s, device).items()}
    return {
        "speedup_vs_plain_simclr": {
            label: {m: round(_median_ratio(plain, by[m + suffix].times), 2) for m in METHODS}
            for label, suffix in arm.items()
        },
        "plain_simclr": {
            "images_per_s": round(workers[best], 1), "workers": best,
            "images_per_s_by_workers": {str(w): round(r, 1) for w, r in sorted(workers.items())},
        },
        "images_per_s_by_precision": {
            label: {m: round(rate[m + suffix], 1) for m in METHODS} for label, suffix in arm.items()
        },
    }


def _time_rounds(
    arms: list[_Arm], s: BenchmarkSettings, device: torch.device, say: Callable[[str], None]
) -> None:
    """Warm every arm up, then time ``s.rounds`` rounds, the arms in another order each round
    (:func:`round_order`)."""
    say(f"warm-up: {s.warmup} step(s) per arm" + (" (includes torch.compile)" if s.compile else ""))
    for arm in arms:
        for _ in range(s.warmup):
            arm.run()
    _sync(device)
    rounds = int(s.rounds or 0)
    for r in range(rounds):
        say(f"round {r + 1}/{rounds}")
        for arm in round_order(arms, r):
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(arm.steps):
                arm.run()
            _sync(device)
            arm.times.append((time.perf_counter() - t0) / arm.steps)


def round_order(arms: list[_Arm], r: int) -> list[_Arm]:
    """Round ``r``'s order of the arms: a permutation seeded by ``r``. A rotation by one per round (the
    order before issue 46) keeps the cyclic order, so every arm had the same predecessor in every round:
    CL's arm always followed the plain loop's 2-worker DataLoader, whose workers go on preparing the
    batches it prefetched while CL is timed (docs/scaling.md, CL's bf16 anomaly)."""
    import random

    order = list(arms)
    random.Random(r).shuffle(order)
    return order


def _demo_arms(s: BenchmarkSettings, device: torch.device) -> list[_Arm]:
    """The demo recipe's BayesNCL training step and its epoch-end held-out monitor
    (:class:`bayesncl.app.heldout.HeldOut`, the default ``train.monitor_samples`` images) on the
    model that step trains: synthetic images at the demo's 28 px (3 channels where Fashion-MNIST has 1: only
    the first convolution differs)."""
    import torch

    from bayesncl.app.heldout import HeldOut
    from bayesncl.paper.demo import DEMO_CONFIG

    over = ["method.name=bayesncl", "data.name=synthetic", "data.image_size=28", "data.train_subset=0",
            f"train.device={s.device}"]  # the whole synthetic split: the speed is the same, no subset warning
    cfg = build_config(DEMO_CONFIG, over)
    step, _, model = _trainer(cfg, device)
    n = cfg.train.monitor_samples
    x = torch.randn(n, 3, 28, 28, generator=torch.Generator().manual_seed(0))
    held = HeldOut(x, torch.arange(n) % 10, cfg.eval.batch_size, cfg.train.precision)
    return [_Arm("demo-step", lambda: step(None), cfg.train.batch_size, 1),
            _Arm("demo-heldout", lambda: held.measure(model, device), n, 1)]


def _heldout_figures(seconds: float, n: int, demo_rate: float) -> dict[str, Any]:
    """The held-out monitor's cost as a share of a demo epoch (the demo recipe's train images at
    ``demo_rate``, its training images/s measured here): the bound is 5 % (issue 16)."""
    from bayesncl.paper.demo import DEMO_CONFIG

    demo_images = build_config(DEMO_CONFIG).data.train_subset
    epoch_s = demo_images / demo_rate
    return {
        "heldout_monitor_s": round(seconds, 3), "heldout_monitor_images": n,
        "heldout_monitor_pct_of_demo_epoch": round(100 * seconds / epoch_s, 2),
        "demo_images_per_s": round(demo_rate, 1),
    }


def _optional(key: str, value: float | None) -> dict[str, float]:
    return {} if value is None else {key: round(value, 1)}


def run_benchmark(
    settings: BenchmarkSettings | None = None, *, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run the benchmark (see the module docstring) and return the result dict.

    Raises ConfigError / DataError (one line) for impossible settings, e.g. CUDA asked for but
    absent, a batch larger than the 5000 synthetic images, or an unknown backbone.
    """
    import torch

    from bayesncl.core.optim import precision_plan

    s, device = default_settings(settings or BenchmarkSettings())
    own = precision_plan(str(s.precision), bool(s.channels_last), device)
    say = log or (lambda msg: None)
    if s.threads:
        torch.set_num_threads(s.threads)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    b = int(s.batch_size or 0)
    configs = {m: _config(s, m, resident=True) for m in METHODS}  # a bad override: its line comes first
    say(f"building {len(METHODS)} models ({s.backbone}, {s.image_size} px, batch {b}) on {device}")
    arms = _arms(s, device, configs)
    flops = {m: flops_per_image(configs[m]) for m in ("ncl", "bayesncl")}
    train_flops = {m: flops_per_image(configs[m], train=True) for m in ("ncl", "bayesncl")}
    _time_rounds(arms, s, device, say)
    # the demo-scale arms in rounds of their own: their long steps would disturb the short ones'
    demo = _demo_arms(s, device)
    _time_rounds(demo, s, device, say)

    by = {a.name: a for a in arms + demo}
    rate = {name: a.images / statistics.median(a.times) for name, a in by.items()}
    compare = s.augment_compare

    def ratio(slow: str, fast: str) -> float | None:
        return round(_median_ratio(by[slow].times, by[fast].times), 2) if compare else None

    return {
        "images_per_s": {m: round(rate[m], 1) for m in METHODS},
        "gate_overhead_pct": round(100 * (_median_ratio(by["bayesncl"].times, by["ncl"].times) - 1), 2),
        "flops_per_image": {m: float(f) for m, f in flops.items()},
        "train_flops_per_pair": {m: float(f) for m, f in train_flops.items()},
        "augment_speedup": ratio("bayesncl/per-sample", "bayesncl"),
        "device": device.type,
        "device_name": _device_name(device),
        "per_sample_images_per_s": round(rate["bayesncl/per-sample"], 1) if compare else None,
        "augment_only_speedup": ratio("per-sample-only", "augment-only"),
        "breakdown": {
            "augment_images_per_s": round(rate["augment-only"], 1),
            **_optional("per_sample_augment_images_per_s", rate.get("per-sample-only")),
            "bayesncl_step_fixed_batch_images_per_s": round(rate["step-only"], 1),
            **_optional("bayesncl_no_prefetch_images_per_s", rate.get("no-prefetch")),
        },
        "gate_flops_pct": round(100 * (train_flops["bayesncl"] / train_flops["ncl"] - 1), 2),
        **(_plain_figures(s, device, by, rate) if s.plain_compare else {}),
        **_heldout_figures(statistics.median(by["demo-heldout"].times), by["demo-heldout"].images,
                           rate["demo-step"]),
        "settings": {
            "backbone": s.backbone, "cifar_stem": s.cifar_stem, "image_size": s.image_size, "batch_size": b,
            "steps": int(s.steps or 0), "rounds": int(s.rounds or 0),
            "precision": own.name, "channels_last": own.channels_last, "compile": s.compile,
            "workers": s.workers,
            "threads": torch.get_num_threads(),
        },
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "image": "one source image = one two-view pair",
    }


# ----------------------------------------------------------------------------- output
def _flops(x: float) -> str:
    return f"{x / 1e9:.3f} GFLOP" if x >= 1e8 else f"{x / 1e6:.2f} MFLOP"


def format_report(r: dict[str, Any]) -> str:
    """The human-readable table of a :func:`run_benchmark` result."""
    st = r["settings"]
    stem = {"true": " (CIFAR stem)", "false": " (ImageNet stem)"}.get(st["cifar_stem"], " (auto stem)")
    stem = stem if st["backbone"].startswith("resnet") else ""
    lines = [
        f"bayesncl benchmark, {r['date']}: {r['device']} ({r['device_name']}), torch {r['torch']}",
        f"{st['backbone']}{stem}, {st['image_size']} px, batch {st['batch_size']}, {st['precision']}, "
        f"channels_last={st['channels_last']}, compile={st['compile']}; median of {st['rounds']} rounds "
        f"x {st['steps']} steps",
        "a step = augment both views + forward + backward + LARS step; an image = one two-view pair",
        "",
        f"{'method':<10} {'images/s':>10}   {'FLOPs/image (fwd)':>18}   {'train FLOPs/pair':>18}",
    ]
    for m, v in r["images_per_s"].items():
        f, t = r["flops_per_image"].get(m), r["train_flops_per_pair"].get(m)
        lines.append(
            f"{m:<10} {v:>10,.1f}   {_flops(f) if f else '-':>18}   {_flops(t) if t else '-':>18}"
        )
    lines.append("")
    lines.append(
        f"gate overhead (BayesNCL vs NCL step time): {r['gate_overhead_pct']:+.2f} %  "
        f"(target <= {GATE_OVERHEAD_TARGET_PCT:g} %; paper +5.9 % on CIFAR-100); "
        f"train FLOPs {r['gate_flops_pct']:+.2f} %"
    )
    if r["augment_speedup"] is not None:
        lines.append(
            f"augmentation, same BayesNCL model: batched {r['images_per_s']['bayesncl']:,.1f} vs per-sample "
            f"PIL DataLoader {r['per_sample_images_per_s']:,.1f} images/s = {r['augment_speedup']:.2f}x"
            + (f"  (CPU target >= {CPU_AUGMENT_TARGET:g}x)" if r["device"] == "cpu" else "")
        )
        lines.append(
            f"augmentation alone, no model: batched {r['breakdown']['augment_images_per_s']:,.1f} vs "
            f"per-sample {r['breakdown']['per_sample_augment_images_per_s']:,.1f} images/s = "
            f"{r['augment_only_speedup']:.2f}x"
        )
    if "heldout_monitor_s" in r:
        lines.append(
            f"held-out monitor (train.monitor_samples={r['heldout_monitor_images']:,}, once per epoch): "
            f"{r['heldout_monitor_s']:.2f} s = {r['heldout_monitor_pct_of_demo_epoch']:.2f} % of a demo "
            f"epoch (the demo recipe's step: {r['demo_images_per_s']:,.1f} images/s; target < "
            f"{HELDOUT_TARGET_PCT:g} %)"
        )
    lines += _plain_lines(r)
    bd = r["breakdown"]
    lines.append(
        f"BayesNCL step on a fixed batch (no data path): {bd['bayesncl_step_fixed_batch_images_per_s']:,.1f} "
        "images/s"
    )
    if "bayesncl_no_prefetch_images_per_s" in bd:
        lines.append(
            f"BayesNCL with the loader on the main CUDA stream (no prefetch_to_device): "
            f"{bd['bayesncl_no_prefetch_images_per_s']:,.1f} images/s"
        )
    if r["device"] == "cuda":
        ok = min(r["images_per_s"].values()) >= GPU_TARGET_IMAGES_PER_S
        lines.append(
            f"GPU target (ResNet-18 CIFAR stem, batch 256, 32 px, one H200): >= {GPU_TARGET_IMAGES_PER_S:,} "
            f"images/s: {'met' if ok else 'NOT met'}"
        )
    return "\n".join(lines)


def _plain_lines(r: dict[str, Any]) -> list[str]:
    """The report's lines on the plain SimCLR loop (none without ``speedup_vs_plain_simclr``)."""
    if "speedup_vs_plain_simclr" not in r:
        return []
    plain = r["plain_simclr"]
    lines = [
        f"plain SimCLR loop (per-sample torchvision DataLoader, fp32; best of 0/1/2 workers: "
        f"{plain['workers']}): {plain['images_per_s']:,.1f} images/s; our step's speed-up over it:"
    ]
    for label, by in r["speedup_vs_plain_simclr"].items():
        rates = r["images_per_s_by_precision"][label]
        lines.append(
            f"  {label:<8} " + ", ".join(f"{m} {x:.2f}x ({rates[m]:,.1f}/s)" for m, x in by.items())
            + (f"  (target >= {PLAIN_TARGET:g}x)" if label == "default" else "")
        )
    return lines


# ----------------------------------------------------------------------------- command line
def _cmd_benchmark(args: argparse.Namespace) -> int:
    given = {f.name: getattr(args, f.name) for f in fields(BenchmarkSettings) if hasattr(args, f.name)}
    given.update(
        augment_compare=not args.no_augment_compare, plain_compare=not args.no_plain_compare,
        extra=list(args.overrides),
    )
    settings = BenchmarkSettings(**given)
    out = sys.stderr if args.json else sys.stdout  # progress beside --json's output, not inside it
    log = lambda msg: print(f"... {msg}", file=out, flush=True)  # noqa: E731
    result = run_benchmark(settings, log=log)
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 0


def _plain_text(rst: str) -> str:
    """The module docstring for ``--help``: ``literal`` → literal, :func:`a.b.f` → f, *em* → em."""
    text = re.sub(r":\w+:`~?(?:[\w.]+\.)?([\w]+)`", r"\1", rst)
    text = re.sub(r"``([^`]+)``", r"\1", text)
    return re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])", r"\1", text)


def add_benchmark_parser(subparsers: Any) -> None:
    """Register ``bayesncl benchmark`` on the CLI's subparsers (``func(args) -> int``)."""
    p = subparsers.add_parser(
        "benchmark",
        help="training images/s of CL, NCL and BayesNCL, gate overhead, FLOPs, augmentation speed-up",
        description=_plain_text(__doc__.split("\n\n", 1)[1]) if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    flag, number = {"action": "store_true"}, {"type": int}
    for name, kwargs, help in [
        ("--json", flag, "print the result as JSON"),
        ("--device", {"default": "auto"}, "auto | cpu | cuda | cuda:N (default auto)"),
        ("--backbone", {"default": "resnet18", "choices": ("resnet18", "resnet50", "small_cnn")}, None),
        ("--cifar-stem", {"choices": ("auto", "true", "false")},
         "3x3 stride-1 stem without max-pool (default: false on CPU, true on CUDA)"),
        ("--image-size", {**number, "default": 32}, "image side in px (default 32)"),
        ("--batch-size", number, "images per step (default 64 CPU, 256 CUDA)"),
        ("--steps", number, "timed steps per arm and round (default 1 CPU, 20 CUDA)"),
        ("--rounds", number, "interleaved rounds; medians (default 12 CPU, 5 CUDA)"),
        ("--warmup", {**number, "default": 2}, "untimed steps per arm first (default 2)"),
        ("--precision", {"choices": ("auto", "fast", "fp32", "fp16", "bf16")},
         "autocast dtype (default auto, as training: bf16 on CUDA; bf16 + channels-last on a CPU with "
         "native bf16, AVX512-BF16 or AMX; fp32 on other CPUs. fp32: the CPU default before)"),
        ("--channels-last", {"action": argparse.BooleanOptionalAction},
         "channels_last memory format (default on for CUDA; off for CPU, where --precision auto or "
         "fast adds it with bf16)"),
        ("--compile", flag, "torch.compile the step: forward + loss (train.compile=true; slow first steps)"),
        ("--no-augment-compare", flag, "skip the per-sample DataLoader path"),
        ("--no-plain-compare", flag, "skip the plain SimCLR loop and our step at the other precisions"),
        ("--workers", {**number, "default": 0}, "workers of the per-sample DataLoader (default 0)"),
        ("--threads", {**number, "default": 0}, "torch intra-op threads (default: leave as is)"),
        ("overrides", {"nargs": "*", "metavar": "key=value"},
         "more config overrides, e.g. model.proj_hidden=4096"),
    ]:
        p.add_argument(name, **kwargs, help=help)
    p.set_defaults(func=_cmd_benchmark)


def main(argv: list[str] | None = None) -> int:
    """``python -m bayesncl.paper.benchmark [options]``: the same command without the ``bayesncl`` CLI."""
    import sys

    from bayesncl.app.errors import readers_may_go, run_command

    with readers_may_go():
        parser = argparse.ArgumentParser(prog="python -m bayesncl")
        add_benchmark_parser(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args(["benchmark", *(sys.argv[1:] if argv is None else argv)])
        return run_command(lambda: args.func(args), "benchmark")

if __name__ == "__main__":
    raise SystemExit(main())
