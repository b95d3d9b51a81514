"""The one place a config's values are checked (:func:`validate`), and the warnings about keys
that cannot change a run (:func:`inert_method_keys`)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import typing
import warnings
from dataclasses import asdict

from bayesncl.config.schema import LOGGERS, Config, DataConfig, EvalDataConfig, choices
from bayesncl.core import methods
from bayesncl.core.configs import ConfigError, ModelConfig
from bayesncl.core.methods import MethodConfig


def warn_inert_keys(method: MethodConfig, inert: list[str], stacklevel: int = 2) -> None:
    """Warn that the method keys ``inert`` (from :func:`inert_method_keys`) have no effect with
    ``method``; nothing when there are none."""
    if inert:
        warnings.warn(
            f"{', '.join(inert)} {'has' if len(inert) == 1 else 'have'} no effect with "
            f"method.name={method.name} (method.gate={method.gate}, method.topk={str(method.topk).lower()})",
            stacklevel=stacklevel + 1,
        )


# The preset whose defining parts a MethodConfig has, e.g. ncl for method.name=ncl-topk method.topk=false.
preset_of = methods.closest


def inert_method_keys(method: MethodConfig, keys: typing.Iterable[str]) -> list[str]:
    """Those of ``keys`` (dotted) that cannot change a run of ``method``: the gating head's settings
    when ``method.gate=none``, ``method.rho`` when there is neither gate nor TopK, the Gumbel noise
    without the Gumbel gate. E.g. ``method.lam`` for ``cl``."""
    inert = methods.unread_keys(method)
    return [k for k in keys if k.startswith("method.") and k.split(".", 1)[1] in inert]


# Smallest data.image_size (besides 0, native): 8 px still trains with every backbone and stem; below
# that the augmentations degenerate (1 px crashes kornia's blur, 2-3 px train at chance).
MIN_IMAGE_SIZE = 8
# train.epochs: the per-iteration lr schedule is one array of epochs x steps; the papers use <= 1000.
MAX_EPOCHS = 100_000


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


TIMM_PREFIX = "timm:"
# Keyword arguments bayesncl sets itself when it builds a timm backbone.
TIMM_FIXED_KWARGS = ("num_classes", "in_chans", "pretrained")


@functools.cache
def timm_models() -> tuple[str, ...]:
    """Every model name timm can build (``timm.list_models()``), read once."""
    import timm

    return tuple(timm.list_models())


def _check_backbone(mo: ModelConfig) -> None:
    """``model.backbone=timm:NAME`` names a timm model (else the closest names); its
    ``model.backbone_kwargs`` are keyword names with plain values, none of those bayesncl sets."""
    kw = mo.backbone_kwargs
    if not mo.backbone.startswith(TIMM_PREFIX):
        _check(
            not kw,
            f"model.backbone_kwargs={kw}: keyword arguments are for timm backbones "
            f"(model.backbone=timm:NAME), not {mo.backbone}",
        )
        return
    name = mo.backbone[len(TIMM_PREFIX):]
    known = timm_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=5, cutoff=0.6)
        hint = f"; close names: {', '.join(close)}" if close else "; see timm.list_models()"
        raise ConfigError(f"model.backbone={mo.backbone}: timm has no model '{name}'{hint}")
    for k, v in kw.items():
        _check(
            k not in TIMM_FIXED_KWARGS,
            f"model.backbone_kwargs.{k}: set by bayesncl (no classifier, the data's channels, no pretrained "
            "weights); leave it out",
        )
        plain = (bool, int, float, str, type(None))
        _check(
            isinstance(v, plain) or (isinstance(v, list) and all(isinstance(x, plain) for x in v)),
            f"model.backbone_kwargs.{k}={v!r}: expected a number, a string, a bool or a list of them",
        )


def _check_eval_data(cfg: Config) -> None:
    """``eval.data.*``: a dataset name (or empty: the training data), and no setting without one."""
    from bayesncl.data import DATASETS

    e = cfg.eval.data
    if not e.name:
        given = [f"eval.data.{k}" for k, v in asdict(e).items() if k != "name" and v not in (None, False, 0)]
        _check(
            not given,
            f"{', '.join(given)} {'has' if len(given) == 1 else 'have'} no effect without eval.data.name "
            "(evaluation reads the training data): set eval.data.name",
        )
        return
    _check(e.name in DATASETS, f"eval.data.name={e.name!r}: expected one of {', '.join(DATASETS)}")
    _check_source("eval.data", e)


def _check_source(section: str, d: DataConfig | EvalDataConfig) -> None:
    """The checks ``data.*`` and ``eval.data.*`` share: the subset sizes and the class list."""
    for key in ("train_subset", "test_subset"):
        _check(getattr(d, key) >= 0, f"{section}.{key}={getattr(d, key)}: expected >= 0")
    _check(
        not d.classes or d.name == "imagefolder",
        f"{section}.classes={d.classes}: a class list selects folders of {section}.name=imagefolder, "
        f"not {d.name}",
    )


def eval_data(cfg: Config) -> DataConfig:
    """The DataConfig evaluation reads: ``data.*`` with its labels, or the ``eval.data.*`` dataset
    at the training geometry (``data.image_size``) and loader settings."""
    from bayesncl.data import image_geometry

    d = dataclasses.replace(cfg.data, labels="auto")
    if not cfg.eval.data.name:
        return d
    size = cfg.data.image_size or image_geometry(cfg.data)[1]
    return dataclasses.replace(d, **asdict(cfg.eval.data), image_size=size)


def validate(cfg: Config) -> None:
    """Range-check every field: the one place values are checked (the code in ``core`` trusts
    them). Raises ConfigError naming the first bad value and what was expected."""
    for key, allowed in choices().items():
        sec, name = key.split(".")
        val = getattr(getattr(cfg, sec), name)
        if key == "model.backbone" and str(val).startswith(TIMM_PREFIX):
            continue  # checked by _check_backbone
        more = " or timm:NAME (a timm model)" if key == "model.backbone" else ""
        _check(val in allowed, f"{key}={val!r}: expected one of {', '.join(allowed)}{more}")
    _check_backbone(cfg.model)
    _check_eval_data(cfg)
    methods.check(cfg.method, cfg.model)
    if methods.get(cfg.method.name).source is not None:  # a user's method: run on this run's settings too
        from bayesncl.core.plugins import check_method

        check_method(methods.get(cfg.method.name), run=cfg.method)
    _check(
        not (methods.get(cfg.method.name).needs_labels and cfg.data.labels == "none"),
        f"method.name={cfg.method.name} learns from labels: it cannot train with data.labels=none",
    )
    t, d, mo = cfg.train, cfg.data, cfg.model
    _check(t.epochs >= 1, f"train.epochs={t.epochs}: expected >= 1")
    _check(t.epochs <= MAX_EPOCHS, f"train.epochs={t.epochs}: expected <= {MAX_EPOCHS}")
    _check(t.batch_size >= 2, f"train.batch_size={t.batch_size}: expected >= 2 (InfoNCE needs negatives)")
    _check(t.base_lr > 0, f"train.base_lr={t.base_lr}: expected > 0")
    _check(t.weight_decay >= 0, f"train.weight_decay={t.weight_decay}: expected >= 0")
    _check(t.warmup_epochs >= 0, f"train.warmup_epochs={t.warmup_epochs}: expected >= 0")
    _check(0.0 <= t.momentum < 1.0, f"train.momentum={t.momentum}: expected 0 <= momentum < 1")
    _check(t.lars_eta > 0, f"train.lars_eta={t.lars_eta}: expected > 0")
    _check(t.probe_lr > 0, f"train.probe_lr={t.probe_lr}: expected > 0")
    _check(t.min_lr >= 0, f"train.min_lr={t.min_lr}: expected >= 0")
    _check(t.warmup_start_lr >= 0, f"train.warmup_start_lr={t.warmup_start_lr}: expected >= 0")
    _check(0.0 <= d.blur_prob <= 1.0, f"data.blur_prob={d.blur_prob}: expected 0 <= p <= 1")
    _check(cfg.eval.batch_size >= 1, f"eval.batch_size={cfg.eval.batch_size}: expected >= 1")
    _check(t.checkpoint_every >= 0, f"train.checkpoint_every={t.checkpoint_every}: expected >= 0")
    _check(t.monitor_samples >= 0, f"train.monitor_samples={t.monitor_samples}: expected >= 0 (0: off)")
    _check(t.monitor_every >= 1, f"train.monitor_every={t.monitor_every}: expected >= 1 (epochs)")
    bad = [name for name in t.loggers if name not in LOGGERS]
    _check(not bad, f"train.loggers={t.loggers}: unknown {', '.join(map(str, bad))}; expected some of "
           f"{', '.join(LOGGERS)}")
    _check(
        d.image_size == 0 or d.image_size >= MIN_IMAGE_SIZE,
        f"data.image_size={d.image_size}: expected 0 (the dataset's native size) or >= {MIN_IMAGE_SIZE} px",
    )
    _check_source("data", d)
    _check(0.0 < d.crop_min_scale <= 1.0, f"data.crop_min_scale={d.crop_min_scale}: expected (0, 1]")
    _check(d.num_workers >= 0, f"data.num_workers={d.num_workers}: expected >= 0")
    _check(
        d.augment == "default" or (d.crop_min_scale == 0.08 and d.blur_prob == 0.5),
        f"data.augment={d.augment} sets the crop scale and blur probability of its YAML files itself: "
        f"data.crop_min_scale={d.crop_min_scale} / data.blur_prob={d.blur_prob} apply to "
        "data.augment=default only; leave them at 0.08 / 0.5",
    )
    _check(0.0 <= d.bg_correlation <= 1.0, f"data.bg_correlation={d.bg_correlation}: expected 0 <= p <= 1")
    _check(
        d.bg_correlation == 0.0 or d.name == "fashion-mnist-bg",
        f"data.bg_correlation={d.bg_correlation}: only data.name=fashion-mnist-bg has backgrounds to "
        f"correlate, not {d.name}",
    )
    for k in cfg.eval.retrieval_dims:
        _check(1 <= k <= mo.proj_dim, f"eval.retrieval_dims: K={k}: expected 1 <= K <= D={mo.proj_dim}")
    _check(
        -(2**63) <= cfg.seed < 2**64,
        f"seed={cfg.seed}: expected an integer from -2**63 to 2**64 - 1 (the range torch's seed takes)",
    )
    check_device(t.device, "train.device")


def check_device(device: str, what: str) -> None:
    """Raise ConfigError unless ``device`` is auto, cpu, cuda or cuda:N; ``what`` names the setting
    in the message (``train.device``, ``benchmark --device``)."""
    _check(
        re.fullmatch(r"auto|cpu|cuda(:\d+)?", device) is not None,
        f"{what}={device!r}: expected auto, cpu, cuda or cuda:N",
    )
