"""Glue from a trained model to metrics: load, extract ONE features file, score it.

``extract_features`` is the only place that runs the encoder for evaluation; every metric, the
probe, kNN, retrieval and the figures read its output (PAPER-NOTES §3 for which features).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Callable, Collection
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bayesncl.app.report import format_retrieval, format_table, write_results
from bayesncl.app.report.figures import run_label, write_figures
from bayesncl.app.stages import Stages
from bayesncl.config import (
    Config,
    ConfigError,
    build_config,
    check_keys,
    load_run_yaml,
    parse_overrides,
)
from bayesncl.core.methods.common import closed_rows
from bayesncl.core.model import ContrastiveModel, build_model
from bayesncl.core.optim import Precision, extraction_precision
from bayesncl.data import DatasetInfo, build_eval_loader, dataset_info, image_geometry
from bayesncl.data.backgrounds import place_names, places_of
from bayesncl.data.dsprites import factor_names, factors_of
from bayesncl.metrics import (
    EvalError,
    EvalWarning,
    compute_all,
    feature_selection_probe,
    knn_accuracy,
    linear_probe,
)
from bayesncl.metrics.authors_selection import authors_selection_probe
from bayesncl.metrics.background import background_metrics, background_probe, background_probe_one_split
from bayesncl.metrics.disentanglement import factor_metrics
from bayesncl.metrics.paper_probe import paper_linear_probe
from bayesncl.runs.features import load_features, save_features
from bayesncl.runs.lock import set_aside_hint
from bayesncl.runs.official import load_official_checkpoint, load_state_strict, looks_official
from bayesncl.runs.safe_load import (
    CheckpointError,
    check_checkpoint_entries,
    is_bayesncl_checkpoint,
    load_checkpoint_file,
)

FEATURE_KEYS = ("h", "p", "z", "features", "alpha", "mask")
#: ``bayesncl evaluate --probe`` values: the fast probe, the paper's probe, or none.
PROBES = ("fast", "paper", "none")
#: The neighbour depth of the default retrieval (P@10, mAP@10): it needs more test samples than this.
RETRIEVAL_DEPTH = 10
#: ``(label, unit, format)`` of the result keys that :func:`score` and :func:`evaluate_model` add to
#: the metric registry's (:mod:`bayesncl.metrics.registry`), for the HTML report's metrics table.
RESULT_KEYS: dict[str, tuple[str, str, str]] = {
    "linear_probe_acc1": ("Linear probe top-1 (LP@1, frozen h)", "%", "{:.2f}"),
    "linear_probe_acc5": ("Linear probe top-5", "%", "{:.2f}"),
    "linear_probe_acc1_std": ("Linear probe top-1, std over seeds", "%", "{:.2f}"),
    "linear_probe_acc5_std": ("Linear probe top-5, std over seeds", "%", "{:.2f}"),
    "linear_probe_protocol": ("Linear probe protocol", "", "{}"),
    "knn_acc1": ("kNN top-1 (frozen h)", "%", "{:.2f}"),
    "background_probe_acc1": ("Background probe (place)", "%", "{:.2f}"),
    "background_probe_protocol": ("Background probe protocol", "", "{}"),
    "gate_open_rate": ("Gate open rate (share of α > threshold)", "fraction", "{:.4f}"),
    "gate_mean_alpha": ("Mean gate probability α", "fraction", "{:.4f}"),
    "rows_all_closed": ("Test images with every gate closed", "fraction", "{:.4f}"),
    "gating": ("Gating of the features", "", "{}"),
    "method": ("Method", "", "{}"),
    "n_test": ("Test images", "count", "{}"),
    "retrieval_note": ("Retrieval", "", "{}"),
    "note": ("Note", "", "{}"),
    # the gradient dynamics a table adds to a run's metrics (metrics.dynamics_correlations; Table 3)
    "AF-GV": ("Activation frequency vs gradient variance, over dims", "Spearman ρ", "{:.3f}"),
    "GV-SC": ("Gradient variance vs SC, over dims", "Spearman ρ", "{:.3f}"),
    "AF-SC": ("Activation frequency vs SC, over dims", "Spearman ρ", "{:.3f}"),
    "dims": ("Dims in those correlations (AF > 0, SC defined)", "count", "{}"),
}  # fmt: skip


@torch.no_grad()
def extract_features(
    model: ContrastiveModel, loader: Any, device: torch.device, keys: tuple[str, ...] = FEATURE_KEYS,
    precision: Precision | None = None,
) -> dict[str, np.ndarray]:
    """Run ``model`` in eval mode over ``loader`` (yielding ``(x, y, idx)``), under ``precision``'s
    autocast and memory format (None: fp32).

    returns: float32 arrays ``h (N, H)``, ``p (N, D)``, ``z (N, D)``, ``features (N, D)`` = z̃ (the
    evaluation features of PAPER-NOTES §3), ``alpha``/``mask (N, D)`` for gated methods, plus
    ``labels (N,)`` and ``indices (N,)`` int64. ``keys`` limits which feature arrays are kept.
    """
    was_training = model.training
    model.eval()
    out: dict[str, list[np.ndarray]] = {k: [] for k in (*keys, "labels", "indices")}
    amp = precision.dtype if precision is not None else None
    channels_last = precision is not None and precision.channels_last
    for x, y, idx in loader:
        x = x.to(device, non_blocking=True)
        x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
        with torch.autocast(device.type, dtype=amp) if amp is not None else nullcontext():
            o = model(x)
        parts = {"h": o.h, "p": o.p, "z": o.z, "features": o.z_tilde, "alpha": o.alpha, "mask": o.mask}
        for k in keys:
            if parts[k] is not None:
                out[k].append(parts[k].float().cpu().numpy())
        out["labels"].append(y.cpu().numpy().astype(np.int64))
        out["indices"].append(idx.cpu().numpy().astype(np.int64))
    model.train(was_training)
    return {k: np.concatenate(v) for k, v in out.items() if v}


def extract_split(
    model: ContrastiveModel, cfg: Config, split: str, device: torch.device,
    keys: tuple[str, ...] = FEATURE_KEYS, info: DatasetInfo | None = None,
) -> dict[str, np.ndarray]:
    """:func:`extract_features` over ``split`` of the run's data (eval transforms, eval batch size;
    ``eval.use_soft_gating``: gated by α instead of the hard mask, ``mask`` still the 0/1 one), plus
    ``places`` (N,) int64 for a dataset with backgrounds (:mod:`bayesncl.data.backgrounds`) and
    ``factors`` (N, F) int64 for one with generative factors (:mod:`bayesncl.data.dsprites`).
    A run is extracted in its training precision where that is bf16 autocast + channels-last:
    ``train.precision=fast`` on a CPU with native bf16 or on CUDA, and ``auto`` on a CPU with native
    bf16 (the forward pass alone is 1.27x as fast there, docs/scaling.md); every other run in fp32
    (``auto`` on CUDA too, as before). ``info``: ``dataset_info(cfg.data)`` where the caller has it."""
    loader = build_eval_loader(cfg.data, split, cfg.eval.batch_size, device=device, info=info)
    precision = extraction_precision(cfg.train.precision, device)
    soft, model.soft_eval_gate = model.soft_eval_gate, cfg.eval.use_soft_gating
    try:
        out = extract_features(model, loader, device, keys=keys, precision=precision)
    finally:
        model.soft_eval_gate = soft
    places = places_of(cfg.data, split)
    if places is not None:
        out["places"] = places[out["indices"]]
    factors = factors_of(cfg.data, split)
    if factors is not None:
        out["factors"] = factors[out["indices"]]
    return out


def evaluate_model(
    model: ContrastiveModel, cfg: Config, run_dir: Path, *, device: torch.device,
    info: DatasetInfo | None = None,
) -> dict[str, Any]:
    """End-of-pretraining evaluation on the test split: :func:`score` with the metrics, retrieval at
    ``eval.retrieval_dims`` and (``eval.probe=fast``) the fast linear probe at ``seed``, plus the
    gate's open rate for gated methods. Writes the figures (unless ``eval.figures`` is false),
    ``metrics.json`` and ``metrics.md`` (its table, retrieval and NCL's map as in the JSON) into
    ``run_dir``; returns the metrics dict. LP@1 is the *offline* fast probe on frozen h (not the online
    probe; solo-learn #221); the paper probe is not run here (``bayesncl evaluate`` runs it).
    ``info``: the DatasetInfo of the data it reads, where the caller has it (the run's facts).
    """
    from bayesncl.app.evaldata import with_eval_data

    cfg = with_eval_data(cfg)  # eval.data.* when set (an unlabeled pretraining set), else data.*
    probe = "fast" if cfg.eval.probe == "fast" else "none"
    dims = cfg.eval.retrieval_dims or None
    stages = Stages(f"{cfg.method.name} evaluation:", enabled=cfg.train.progress)
    test, metrics = score(
        model, cfg, device=device, probe=probe, retrieval_dims=dims, info=info, stages=stages
    )
    _add_run_facts(metrics, test, cfg)
    names = info.class_names if info is not None else None
    if cfg.eval.figures:
        gated = ", suppressed_features.png)" if "mask" in test else ")"
        stages.next("figures (top_activations.png" + gated)
        label = run_label(cfg.method.name, run_dir, cfg.seed)
        write_figures(test, cfg.data, run_dir, label=label, names=names)
    md = format_table({cfg.method.name: metrics}) + _retrieval_markdown(metrics)  # what metrics.json holds
    write_results(run_dir, "metrics", metrics, md)
    stages.done()
    return metrics


def score(
    model: ContrastiveModel, cfg: Config, *, device: torch.device, probe: str = "none",
    seeds: list[int] | None = None, probe_epochs: int = 50, retrieval_dims: list[int] | str | None = None,
    selection_probe: bool = False, knn: bool = False, info: DatasetInfo | None = None,
    stages: Stages | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The one evaluation path: extract the test split (and the train split where a probe or kNN
    needs it), then :func:`compute_all`, the linear probe, the feature-selection probe and kNN.

    probe: ``"fast"`` (:func:`linear_probe` on h), ``"paper"`` (:func:`paper_linear_probe`) or
    ``"none"``. seeds: the probe's; two or more are reported with their spread (``*_std``,
    ``linear_probe_seeds``), one has none (nor does ``None``: ``cfg.seed``). retrieval_dims: the K
    list; ``"auto"``: 32, 64, ..., D, skipped (``retrieval_note``) for ``RETRIEVAL_DEPTH`` test
    samples or fewer; ``None``: none.
    selection_probe: at K = min(``eval.retrieval_dims`` or [64, D]), with a probe. knn: Acc@1 on h.
    ``stages``: told each stage as it begins (:class:`bayesncl.app.stages.Stages`; None: nothing said).
    Returns ``(test arrays of extract_features, results)``; writes nothing. Raises EvalError.
    """
    stages = stages or Stages("", enabled=False)
    stages.next("extracting the test split's features")
    test = extract_split(model, cfg, "test", device, info=info)
    train: dict[str, np.ndarray] = {}
    if knn or "places" in test or (probe != "none" and (probe == "fast" or selection_probe)):
        keys = ("h", "features", "p") if selection_probe else ("h",)
        stages.next("extracting the train split's features (for the probe)")
        train = extract_split(model, cfg, "train", device, keys=keys, info=info)
    n_test, d = test["features"].shape
    note = None
    if retrieval_dims == "auto":
        retrieval_dims = list(range(32, d + 1, 32)) or [d]
        if n_test <= RETRIEVAL_DEPTH:
            retrieval_dims, note = None, (
                f"retrieval skipped: it needs at least {RETRIEVAL_DEPTH + 1} test samples (P@10, mAP@10); "
                f"got {n_test}"
            )
    stages.next("metrics" + (f" and retrieval at K = {retrieval_dims}" if retrieval_dims else ""))
    result: dict[str, Any] = compute_all(test["features"], test["labels"], retrieval_dims=retrieval_dims)
    if note:
        result["retrieval_note"] = note
    if probe != "none":
        stages.next(f"{'paper' if probe == 'paper' else 'fast'} linear probe on h")
        if probe == "paper":
            lp = paper_linear_probe(model, cfg, epochs=probe_epochs, seeds=seeds)
        else:
            lp = linear_probe(train["h"], train["labels"], test["h"], test["labels"], seeds=seeds or cfg.seed)
        result.update(linear_probe_acc1=lp["acc1"], linear_probe_acc5=lp["acc5"])
        if seeds is not None and len(seeds) > 1:  # one seed has no spread
            result.update(linear_probe_acc1_std=lp["acc1_std"], linear_probe_acc5_std=lp["acc5_std"])
            result["linear_probe_seeds"] = seeds
        result["linear_probe_protocol"] = lp["protocol"]
    if probe != "none" and selection_probe:
        k_sel = min(cfg.eval.retrieval_dims or [min(64, d)])
        if cfg.eval.selection_probe == "authors":  # the NCL code's SGD probe on p (docs/metrics.md)
            fs = authors_selection_probe(train["p"], train["labels"], test["p"], test["labels"], k_sel,
                                         seed=cfg.seed)  # fmt: skip
        else:
            fs = feature_selection_probe(
                train["features"], train["labels"], test["features"], test["labels"], k_sel
            )
        result["feature_selection_probe"] = {"k": k_sel, "acc1": fs["acc1"], "acc5": fs["acc5"],
                                             "form": cfg.eval.selection_probe}  # fmt: skip
    if knn:
        stages.next("kNN on h")
        result["knn_acc1"] = knn_accuracy(train["h"], train["labels"], test["h"], test["labels"])["acc1"]
    if "places" in test:  # docs/metrics.md, "Background metrics"
        result.update(background_metrics(
            test["features"], test["labels"], test["places"], z=test.get("z"), mask=test.get("mask")
        ))
        result.update(background_probe(train["h"], train["places"], test["h"], test["places"], seed=cfg.seed))
    if "factors" in test:  # docs/metrics.md, "MIG"
        result.update(factor_metrics(test["features"], test["factors"], factor_names(cfg.data.name)))
    return test, result


def _add_run_facts(result: dict[str, Any], test: dict[str, np.ndarray], cfg: Config) -> None:
    """The method, the test images and, for a gated run, the gate's open rate (share of entries with
    α > threshold), the mean gate probability α and the share of test images with every gate closed
    (``rows_all_closed``: :func:`bayesncl.core.methods.common.closed_rows`, the training statistic's
    definition), from ``test["mask"]`` (N, D), the hard mask 1[α > method.threshold]
    (also under ``eval.use_soft_gating``; ``gating`` then says the features were gated by α)."""
    if "mask" in test:
        hard = test["mask"]
        result["gate_open_rate"] = float(hard.mean())
        result["rows_all_closed"] = float(closed_rows(hard > 0).mean())
        if test.get("alpha") is not None:  # (a soft gate's training gate_open in older logs was this)
            result["gate_mean_alpha"] = float(test["alpha"].mean())
        if (gating := gating_text(cfg)) is not None:
            result["gating"] = gating
    result["method"] = cfg.method.name
    result["n_test"] = int(len(test["labels"]))


def gating_text(cfg: Config) -> str | None:
    """How a gated run's features were gated, where they are shown (evaluation.json's ``gating``,
    evaluation.md, the report's dimension index and pages): None for the hard mask (the default)."""
    if not cfg.eval.use_soft_gating:
        return None
    thr = cfg.method.threshold
    return (f"soft, by α (eval.use_soft_gating): z̃ = normalize(normalize(z) ⊙ α), so a closed gate scales "
            f"z̃_k down without zeroing it; gate open and closed are the hard mask 1[α > {thr:g}]")


# ----------------------------------------------------------------------------- loading trained runs
class UnreadableCheckpoint(EvalError):
    """:func:`load_trained`'s (and :func:`trained_config`'s) one line where the checkpoint of its source
    is missing or does not read as a model checkpoint. ``path``: that checkpoint file; ``reason``: what
    is wrong with it, short (``"is missing"``, ``"cannot be read (...)"``), for a caller that knows
    where the source came from and so what to do (``reproduce``'s stored runs:
    :func:`bayesncl.paper.variants.measuring`; ``finetune --resume``'s source)."""

    def __init__(self, message: str, path: Path, reason: str) -> None:
        super().__init__(message)
        self.path, self.reason = path, reason


def load_trained(
    source: str | Path, device: torch.device | None = None, overrides: list[str] | None = None,
    command: str | None = None,
) -> tuple[ContrastiveModel, Config, Path]:
    """Load a trained model safely (``weights_only=True`` or safetensors: no pickled code runs).

    source: a run dir (its ``last.pt``), a bayesncl checkpoint (``bayesncl-checkpoint-v1``), a
    run's ``encoder.safetensors`` (it carries its config) or an authors'-layout BayesNCL/NCL
    checkpoint (:mod:`bayesncl.runs.official`). overrides: ``key=value``; for a bayesncl checkpoint
    only ``data.*`` and ``eval.*``, for an official one the data is required and ``method.name``
    may be set. command: the command being run, named in the advice of a data-mismatch error.

    Returns ``(model in eval mode, config, output folder)``: the run dir for a run dir, its
    ``last.pt`` or ``encoder.safetensors``; ``RUN/eval-epoch-NNNN/`` for ``RUN/epoch-NNNN.pt``; else
    the checkpoint's folder. Raises EvalError (one line) for anything unusable, ConfigError for bad
    overrides.
    """
    src = Path(source)
    if src.is_dir():
        ckpt_path = src / "last.pt"
        if not ckpt_path.exists():
            raise UnreadableCheckpoint(
                f"{src} holds no last.pt: not a bayesncl run dir (or pass a checkpoint file)"
                + set_aside_hint(src), ckpt_path, "is missing",
            )
        out_dir = src
    elif src.is_file():
        ckpt_path, out_dir = src, src.parent
        run_last = src.parent / "last.pt"
        if run_last.is_file() and src.name != "encoder.safetensors" and src.resolve() != run_last.resolve():
            # an earlier checkpoint of a run (epoch-NNNN.pt): its results go to a folder of their
            # own, never over the run's final features/evaluation/figures
            out_dir = src.parent / f"eval-{src.stem}"
    else:
        raise UnreadableCheckpoint(f"{src}: no such run dir or checkpoint file", src, "is missing")
    try:
        obj = load_checkpoint_file(ckpt_path)
        if is_bayesncl_checkpoint(obj):
            check_checkpoint_entries(obj, ckpt_path)
            model, cfg = _load_own(ckpt_path, obj["config"], obj["state_dict"], overrides, command)
        elif _is_own_encoder(ckpt_path, obj):
            cfg_dict, cfg_source = _encoder_config(ckpt_path)
            model, cfg = _load_own(ckpt_path, cfg_dict, obj, overrides, command, cfg_source=cfg_source)
        elif looks_official(obj):
            model, cfg = _load_official(ckpt_path, obj, overrides)
        else:
            raise _not_a_model(ckpt_path, obj)
    except CheckpointError as e:
        raise UnreadableCheckpoint(str(e), ckpt_path, f"cannot be read ({getattr(e, 'reason', e)})") from None
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), cfg, out_dir


def trained_config(source: str | Path) -> Config | None:
    """The config the model of ``source`` (what :func:`load_trained` takes) was trained with, read
    without its weights: a run dir's config.yaml (else its last.pt's), an ``encoder.safetensors``'
    metadata (else the config.yaml beside it), a bayesncl checkpoint's ``config`` (its tensors
    memory-mapped, not read). None only for the authors' layout (weights that record no config by
    design). One line, EvalError / CheckpointError / ConfigError, for a source that does not exist or
    cannot be read, and for a config that cannot: a damaged config.yaml, metadata or ``config`` entry,
    an export of ours that records none, a file that is no model checkpoint."""
    from bayesncl.runs.export import load_run_config

    src = Path(source)
    if src.is_dir():
        if (src / "config.yaml").exists():
            return load_run_config(src)
        path = src / "last.pt"
        if not path.exists():
            what = "not a bayesncl run dir (or pass a checkpoint file)"
            raise EvalError(f"{src} holds no last.pt: {what}{set_aside_hint(src)}")
    elif src.exists():
        path = src
    else:
        raise EvalError(f"{src}: no such run dir or checkpoint file")
    obj: Any = None
    names: list[str] | None = None
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                names = list(f.keys())
        else:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - not readable so: the safe loader reads it or says why in one line
        pass
    if names is not None and _is_own_encoder(path, dict.fromkeys(names)):  # ours records its config
        cfg_dict, cfg_source = _encoder_config(path)  # EvalError where it records none, or a damaged one
        return build_config(cfg_dict, source=cfg_source)
    if obj is None:  # another's safetensors (its tensors read), or a file torch.load could not map
        obj = load_checkpoint_file(path)
    if is_bayesncl_checkpoint(obj):
        check_checkpoint_entries(obj, path)  # a 'config' entry missing or damaged: one line
        return build_config(obj["config"], source=path)
    if looks_official(obj):
        return None  # the authors' layout: weights without a config
    raise _not_a_model(path, obj)


def _not_a_model(path: Path, obj: Any) -> UnreadableCheckpoint:
    """A file that reads, but as neither of the checkpoints bayesncl reads (``obj``: what it holds)."""
    what = f"is not a model checkpoint bayesncl can read: {_what_is(obj)}"
    return UnreadableCheckpoint(f"{path} {what}", path, f"cannot be read ({path} {what})")


def _what_is(obj: Any) -> str:
    if isinstance(obj, dict):
        keys = [str(k) for k in list(obj)[:4]]
        more = f" and {len(obj) - 4} more" if len(obj) > 4 else ""
        return (
            f"neither a bayesncl checkpoint (no 'format': 'bayesncl-checkpoint-v1') nor BayesNCL/NCL "
            f"weights (no backbone.* tensors); its keys: {', '.join(keys) or 'none'}{more}"
        )
    return f"it holds a {type(obj).__name__}, expected a dict"


def _is_own_encoder(path: Path, obj: Any) -> bool:
    """A run's ``encoder.safetensors`` (our key names: ``projector.net.*``)."""
    return path.suffix == ".safetensors" and isinstance(obj, dict) and any(
        str(k).startswith("projector.net.") for k in obj
    )


def _encoder_config(path: Path) -> tuple[dict[str, Any], Path]:
    """The config of an exported ``encoder.safetensors``, and the file it came from: its metadata (key
    ``config``, written by :func:`bayesncl.app.train.export_encoder`), else the run's ``config.yaml``
    beside it (files exported before the metadata held it). Raises EvalError if neither exists."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if "config" in meta:
        try:
            cfg = json.loads(meta["config"])
        except json.JSONDecodeError as e:
            raise EvalError(
                f"{path}: the config in its metadata is not valid JSON ({e.msg} at character {e.pos}): "
                "damaged or edited; put the run's config.yaml beside a copy without it, or export again"
            ) from None
        if not isinstance(cfg, dict):
            raise EvalError(
                f"{path}: the config in its metadata is a JSON {type(cfg).__name__}, expected an object of "
                "config sections: damaged or edited; export again"
            )
        return cfg, path
    beside = path.parent / "config.yaml"
    if beside.is_file():
        return load_run_yaml(beside), beside
    raise EvalError(
        f"{path} records no config (an export from an older bayesncl) and no config.yaml is beside it: "
        "copy the run's config.yaml next to it"
    )


def _load_own(
    path: Path, cfg_dict: dict[str, Any], state_dict: dict[str, torch.Tensor], overrides: list[str] | None,
    command: str | None = None, cfg_source: Path | None = None,
) -> tuple[ContrastiveModel, Config]:
    """``cfg_source``: the file ``cfg_dict`` was read from, named by a config error (default ``path``)."""
    user = parse_overrides(list(overrides or []))
    check_keys(user)  # an unknown key: the usual error, with the closest keys
    fixed = [k for k in user if not k.startswith(("data.", "eval."))]
    if fixed:
        raise EvalError(
            f"{path}: {', '.join(fixed)} cannot be overridden for a bayesncl checkpoint (its config defines "
            "the model); only data.* and eval.* can"
        )
    cfg = build_config(cfg_dict, user, source=cfg_source or path)
    from bayesncl.config import eval_data

    # with eval.data.* the training data need not be here (an encoder trained elsewhere, or on Python data)
    info = dataset_info(eval_data(cfg) if cfg.eval.data.name else cfg.data)
    # the online probe's head keeps the trained class count: evaluation does not use it, so a
    # data.* override with other classes (a transfer evaluation) is no architecture mismatch
    head = state_dict.get("classifier.weight")
    num_classes = int(head.shape[0]) if head is not None and head.ndim == 2 else info.num_classes
    if num_classes != info.num_classes:
        read = f"eval.data.name={cfg.eval.data.name}" if cfg.eval.data.name else f"data.name={cfg.data.name}"
        warnings.warn(
            f"{path}: its online classifier has {num_classes} classes but {read} has "
            f"{info.num_classes}; features are extracted anyway (the classifier is not used)",
            stacklevel=2,
        )
    model = build_model(cfg, info.channels, info.image_size, num_classes)
    try:
        load_state_strict(model, state_dict, str(path), "the architecture its config describes")
    except ValueError as e:
        trained_data = build_config(cfg_dict).data  # the data it was trained on, before the overrides
        why = _data_mismatch(path, trained_data, cfg, info.channels, info.image_size, command)
        raise EvalError(why or str(e)) from None
    return model, cfg


def _data_mismatch(
    path: Path, trained: Any, cfg: Config, channels: int, size: int, command: str | None = None
) -> str | None:
    """Why the weights do not fit when data.* overrides changed the images the model is built for
    (channels, or an image size that switches the ResNet stem); ``None`` when they did not.
    ``command``: the command being run, named in the advice (else "use")."""
    trained_channels, trained_size = image_geometry(trained)
    if channels != trained_channels:
        return (
            f"{path}: data.name={cfg.data.name} has {channels}-channel images but the model was trained on "
            f"{trained_channels}-channel {trained.name} images: {command or 'use'} with a dataset of "
            f"{trained_channels}-channel images"
        )
    if size != trained_size:
        return (
            f"{path}: data.name={cfg.data.name} with data.image_size={cfg.data.image_size} gives {size} px "
            f"images but the model was trained on {trained_size} px {trained.name} images, and "
            f"model.cifar_stem={cfg.model.cifar_stem} builds another first layer for them: set "
            f"data.image_size={trained_size}"
        )
    return None


def _load_official(path: Path, obj: Any, overrides: list[str] | None) -> tuple[ContrastiveModel, Config]:
    user = parse_overrides(list(overrides or []))
    if "data.name" not in user:
        raise EvalError(
            f"{path} is a BayesNCL/NCL (solo-learn) checkpoint, which does not record its data: pass it as "
            "overrides, e.g. data.name=cifar100 data.root=DIR"
        )
    data_cfg = build_config(overrides={k: v for k, v in user.items() if k.startswith("data.")}).data
    info = dataset_info(data_cfg)
    model, cfg = load_official_checkpoint(path, user, num_classes=info.num_classes, obj=obj)
    conv1 = getattr(model.backbone, "conv1", None)
    if conv1 is not None and conv1.in_channels != info.channels:
        raise EvalError(
            f"{path} expects {conv1.in_channels}-channel images but data.name={cfg.data.name} has "
            f"{info.channels}: pass the dataset the checkpoint was trained on"
        )
    n_cls = model.classifier.out_features
    if n_cls != info.num_classes:
        logging.getLogger("bayesncl").warning(
            "%s: its classifier has %d classes but data.name=%s has %d; features are extracted anyway "
            "(the classifier is not used)", path, n_cls, cfg.data.name, info.num_classes,
        )
    return model, cfg


def extract_command(
    source: str | Path, *, split: str = "test", out: str | Path | None = None,
    overrides: list[str] | None = None, factors: bool = False,
) -> Path:
    """``bayesncl extract``: write ``features_<split>.npz`` (see docs/architecture.md).

    ``overrides``: see :func:`load_trained` (official checkpoints need ``data.name=...``).
    ``factors``: the factors are required (EvalError, nothing written, for a dataset without them)."""
    if out is not None and Path(out).is_dir():
        raise EvalError(f"--out {out} is a directory; give a file name such as {Path(out) / 'features.npz'}")
    if out is not None and Path(out).suffix.lower() != ".npz":  # never last.pt, config.yaml, ... of a run
        raise EvalError(f"--out {out}: expected a .npz file path (a features file)")
    model, cfg, out_dir = load_trained(source, overrides=overrides, command="extract")
    if factors and not factor_names(cfg.data.name):
        raise EvalError(
            f"--factors: data.name={cfg.data.name} has no generative factors (datasets with them: dsprites)"
        )
    device = next(model.parameters()).device
    arrays = extract_split(model, cfg, split, device)
    path = Path(out) if out else out_dir / f"features_{split}.npz"
    save_split_features(path, arrays, cfg, split, source)
    return path


def save_split_features(
    path: Path, arrays: dict[str, np.ndarray], cfg: Config, split: str, source: str | Path
) -> None:
    """Write the ONE features file of a split (docs/architecture.md), with its metadata."""
    meta = {"method": cfg.method.name, "dataset": cfg.data.name, "split": split,
            "class_names": list(dataset_info(cfg.data).class_names), "source": str(source)}  # fmt: skip
    if "places" in arrays:
        meta["place_names"] = list(place_names(cfg.data.name))
    if "factors" in arrays:
        meta["factor_names"] = list(factor_names(cfg.data.name))
    if "mask" in arrays:  # True: the features are gated by α (``mask`` is the hard mask all the same)
        meta["soft_gating"] = cfg.eval.use_soft_gating
    save_features(path, meta=meta, **arrays)


def _refuse_unused_probe_options(
    probe: str, where: str, given: Collection[str], probe_seeds: int, probe_epochs: int
) -> None:
    """ConfigError for a ``given`` option that ``probe`` (set by ``where``, e.g. ``--probe none``)
    does not use: the seeds without a probe, the epochs without the paper probe."""
    if "probe_seeds" in given and probe == "none":
        raise ConfigError(
            f"--probe-seeds {probe_seeds} has no effect with {where}: it sets the linear probe's seeds "
            "(--probe fast or paper)"
        )
    if "probe_epochs" in given and probe != "paper":
        raise ConfigError(
            f"--probe-epochs {probe_epochs} has no effect with {where}: it sets the paper probe's epochs "
            "(--probe paper)"
        )


def evaluate_command(
    source: str | Path, *, retrieval_dims: list[int] | None = None, knn: bool = True,
    overrides: list[str] | None = None, probe_seeds: int = 1, probe: str | None = None,
    probe_epochs: int = 50, given: Collection[str] = (),
    report: Callable[[Path, dict[str, np.ndarray], Config, dict[str, Any]], object] | None = None,
) -> dict[str, Any]:
    """``bayesncl evaluate``: load the model, :func:`score` it (metrics, linear probe with mean ± std
    over ``probe_seeds``, kNN, retrieval, feature-selection probe), then write ``features_test.npz``,
    ``evaluation.json`` / ``.md``, the figures and ``embedding.png`` (t-SNE of z̃ by class,
    :mod:`bayesncl.app.report.embedding`; no figure with ``eval.figures=false``) beside the checkpoint
    (only once all is computed).

    ``probe``: fast, paper or none; ``None``: the run's ``eval.probe`` (after ``overrides``).
    ``retrieval_dims``: ``None`` is :func:`score`'s ``"auto"``. ``given``: the options the user gave
    (``"probe_seeds"``, ``"probe_epochs"``). ``report``: called last with (folder, test features,
    config, result); the CLI passes ``app.report.html.write_run_report`` (which imports this module).
    Raises EvalError (one line) for unusable input, ConfigError for a ``--probe`` that contradicts an
    ``eval.probe=`` override or a ``given`` option the probe does not use.
    """
    asked = parse_overrides(list(overrides or [])).get("eval.probe")
    if probe is not None and asked is not None and str(asked) != probe:
        raise ConfigError(f"--probe {probe} contradicts eval.probe={asked}: give one of them")
    if probe is not None and probe not in PROBES:
        raise ConfigError(f"--probe {probe}: expected one of {', '.join(PROBES)}")
    if probe is not None:  # refused before anything is loaded
        _refuse_unused_probe_options(probe, f"--probe {probe}", given, probe_seeds, probe_epochs)
    model, cfg, out_dir = load_trained(source, overrides=overrides, command="evaluate")
    from bayesncl.app.evaldata import check_eval_data, with_eval_data

    info = dataset_info(with_eval_data(cfg).data)  # the data the model was built for (as _load_own)
    check_eval_data(cfg, info, info, command="evaluate")
    cfg = with_eval_data(cfg)  # eval.data.* when set (an unlabeled pretraining set), else data.*
    if probe is None:
        where = f"eval.probe={asked}" if asked is not None else f"the run's eval.probe={cfg.eval.probe}"
        _refuse_unused_probe_options(cfg.eval.probe, where, given, probe_seeds, probe_epochs)
    probe = probe or cfg.eval.probe
    if probe != "none" and info.num_classes < 2:
        raise EvalError(
            f"{cfg.data.name} has {info.num_classes} class: the linear probe needs >= 2; pass --probe none "
            "or eval.probe=none"
        )
    seeds, device = [cfg.seed + i for i in range(probe_seeds)], next(model.parameters()).device
    stages = Stages("evaluate:", enabled=cfg.train.progress)
    test, result = score(
        model, cfg, device=device, probe=probe, seeds=seeds, probe_epochs=probe_epochs,
        retrieval_dims=retrieval_dims or "auto", selection_probe=True, knn=knn, stages=stages,
    )  # fmt: skip
    _add_run_facts(result, test, cfg)
    md = _evaluation_markdown(result)
    # everything is computed: only now write the files
    save_split_features(out_dir / "features_test.npz", test, cfg, "test", source)
    write_results(out_dir, "evaluation", result, md)
    if cfg.eval.figures:
        stages.next("figures (top_activations.png, suppressed_features.png for a gate, embedding.png)")
        write_figures(test, cfg.data, out_dir, label=run_label(cfg.method.name, out_dir, cfg.seed))
        from bayesncl.app.report.embedding import write_embedding_map

        write_embedding_map(test["features"], test["labels"], info.class_names,
                            out_dir / "embedding.png", label=run_label(cfg.method.name, out_dir, cfg.seed))
    stages.done()
    print(md)
    print(json.dumps({k: v for k, v in result.items() if k != "retrieval"}, indent=2, default=float))
    if report is not None:
        report(out_dir, test, cfg, result)
    return result


def _evaluation_markdown(result: dict[str, Any]) -> str:
    """``evaluation.md``: the results table, the probe's protocol, retrieval and the notes."""
    md = format_table({result["method"]: result})
    if "linear_probe_protocol" in result:
        md += f"\n\nLP@1 protocol: {result['linear_probe_protocol']}"
    else:
        md += "\n\nNo linear probe (eval.probe=none)."
    md += _retrieval_markdown(result)
    if "gating" in result:
        md += f"\n\nGated features: {result['gating']}."
    return md


def _retrieval_markdown(result: dict[str, Any]) -> str:
    """The retrieval part of ``metrics.md`` / ``evaluation.md``: the table of ``retrieval`` (percent),
    NCL's own map (``ncl_map``, docs/metrics.md) and the ``retrieval_note``; "" for a result without
    them."""
    md = ""
    if result.get("retrieval"):
        md += "\n\nRetrieval with feature selection (top-K dims by expected activation), %:\n\n"
        md += format_retrieval(result["retrieval"], active=result.get("active_dims"))
    if result.get("ncl_map"):
        md += "\n\nNCL's own retrieval map (PKU-ML/non_neg main_eval.py; docs/metrics.md), %:\n\n"
        md += "| K | NCL map |\n|---:|---:|\n"
        md += "\n".join(f"| {k} | {float(v):.2f} |" for k, v in result["ncl_map"].items())
    if "retrieval_note" in result:
        md += f"\n\nNote: {result['retrieval_note']}."
    if "gate_open_rate" in result:  # docs/metrics.md, "The gate: open rate and mean α"
        md += (f"\n\nGate (test split): open rate {result['gate_open_rate']:.4f} (α > method.threshold)"
               + (f", mean α {result['gate_mean_alpha']:.4f}" if "gate_mean_alpha" in result else "")
               + f", images with every gate closed {result['rows_all_closed']:.4f}.")
    if "gating" in result:
        md += f"\n\nGated features: {result['gating']}."
    return md


def features_threshold(path: Path) -> float:
    """The gate threshold at which an older soft-gated features file's α is read as its mask
    (:func:`bayesncl.runs.features.load_features`): the run's ``method.threshold`` where ``path`` lies
    in a run dir with a ``config.yaml`` (``evaluate`` and ``extract`` write there), or in an
    ``eval-<checkpoint>/`` folder of one (where they write an earlier checkpoint's, ``RUN/eval-epoch-NNNN/``:
    :func:`load_trained`), else 0.5 (that key's default; a ``config.yaml`` that is no run's config, e.g. a
    user's file beside theirs, counts as none)."""
    from bayesncl.runs.export import load_run_config

    folder = Path(path).parent
    for run in (folder, folder.parent) if folder.name.startswith("eval-") else (folder,):
        if (run / "config.yaml").is_file():
            try:
                return float(load_run_config(run).method.threshold)
            except (ConfigError, OSError):
                pass
    return 0.5


def metrics_command(
    path: str | os.PathLike[str], retrieval_dims: list[int] | None = None, as_json: bool = False,
    mig: bool = False,
) -> dict[str, Any]:
    """Load a features file (or plain .npz with ``features`` and ``labels``) and compute all metrics.

    ``mig``: MIG is required (EvalError when the file carries no ``factors``); without it MIG is
    reported whenever the file carries them. Returns :func:`compute_all`'s dict plus ``source``
    (path, N, D, and ``method``, ``dataset``,
    ``split`` from the file's meta when present), JSON-serialisable (``as_json``: checked by a round
    trip through ``json``). An older soft-gated file's ``mask`` (which held α) is read at the run's
    ``method.threshold`` where the file lies in a run dir whose ``config.yaml`` reads (or in its
    ``eval-epoch-NNNN/``), else at 0.5 (:func:`features_threshold`).
    """
    fs = load_features(path, threshold=features_threshold(Path(path)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EvalWarning)  # the dict carries the note
        out = compute_all(fs.features, fs.labels, retrieval_dims)
    if fs.places is not None:  # docs/metrics.md, "Background metrics"
        gated = fs.mask is not None and fs.z is not None
        out.update(background_metrics(
            fs.features, fs.labels, fs.places, z=fs.z if gated else None, mask=fs.mask if gated else None
        ))
        probe_on = "h" if fs.h is not None else "features"
        out.update(background_probe_one_split(fs.h if fs.h is not None else fs.features, fs.places))
        out["background_probe_protocol"] += f" (on {probe_on})"
    if fs.factors is not None or mig:  # docs/metrics.md, "MIG"; --mig without factors: one line
        if fs.factors is None:
            raise EvalError(
                f"{path} carries no factor labels ('factors'): MIG needs them; extract a dataset with "
                "generative factors (data.name=dsprites)"
            )
        out.update(factor_metrics(fs.features, fs.factors, fs.factor_names))
    source: dict[str, Any] = {"path": str(path), "num_samples": fs.num_samples, "dim": fs.dim}
    for key in ("method", "dataset", "split"):
        if key in fs.meta:
            source[key] = fs.meta[key]
    out["source"] = source
    if as_json:
        out = json.loads(json.dumps(out, allow_nan=False))
    return out
