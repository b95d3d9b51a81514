"""Glue from a trained model to metrics: load, extract ONE features file, score it.

``extract_features`` is the only place that runs the encoder for evaluation; every metric, the
probe, kNN, retrieval and the figures read its output (PAPER-NOTES §3 for which features).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bayesncl.config import Config
from bayesncl.data import build_eval_loader, dataset_info
from bayesncl.models import ContrastiveModel, build_model

FEATURE_KEYS = ("h", "p", "z", "features", "alpha", "mask")


@torch.no_grad()
def extract_features(
    model: ContrastiveModel,
    loader: Any,
    device: torch.device,
    keys: tuple[str, ...] = FEATURE_KEYS,
) -> dict[str, np.ndarray]:
    """Run ``model`` in eval mode over ``loader`` (yielding ``(x, y, idx)``).

    returns: float32 arrays ``h (N, H)``, ``p (N, D)``, ``z (N, D)``, ``features (N, D)`` = z̃ (the
    evaluation features of PAPER-NOTES §3), ``alpha``/``mask (N, D)`` for gated methods, plus
    ``labels (N,)`` and ``indices (N,)`` int64. ``keys`` limits which feature arrays are kept.
    """
    was_training = model.training
    model.eval()
    out: dict[str, list[np.ndarray]] = {k: [] for k in (*keys, "labels", "indices")}
    for x, y, idx in loader:
        o = model(x.to(device, non_blocking=True))
        parts = {"h": o.h, "p": o.p, "z": o.z, "features": o.z_tilde, "alpha": o.alpha, "mask": o.mask}
        for k in keys:
            if parts[k] is not None:
                out[k].append(parts[k].float().cpu().numpy())
        out["labels"].append(y.cpu().numpy().astype(np.int64))
        out["indices"].append(idx.cpu().numpy().astype(np.int64))
    model.train(was_training)
    return {k: np.concatenate(v) for k, v in out.items() if v}


def evaluate_model(
    model: ContrastiveModel, cfg: Config, run_dir: Path, *, device: torch.device
) -> dict[str, Any]:
    """End-of-pretraining evaluation on the test split: interpretability metrics + fast linear probe.

    Writes ``metrics.json`` and ``metrics.md`` into ``run_dir``; returns the metrics dict.
    LP@1 is the *offline* fast probe on frozen h (not the online probe; solo-learn #221).
    """
    from bayesncl.evaluation.metrics import compute_all
    from bayesncl.evaluation.probe import linear_probe
    from bayesncl.report import format_table, write_results

    bs = cfg.eval.batch_size
    test = extract_features(model, build_eval_loader(cfg.data, "test", bs, device=device), device)
    metrics: dict[str, Any] = compute_all(
        test["features"], test["labels"], retrieval_dims=cfg.eval.retrieval_dims or None
    )
    if cfg.eval.probe == "fast":
        train = extract_features(
            model, build_eval_loader(cfg.data, "train", bs, device=device), device, keys=("h",)
        )
        probe = linear_probe(train["h"], train["labels"], test["h"], test["labels"], seed=cfg.seed)
        metrics["linear_probe_acc1"] = probe["acc1"]
        metrics["linear_probe_acc5"] = probe["acc5"]
        metrics["linear_probe_protocol"] = (
            "fast: L-BFGS logistic regression on frozen h, L2 chosen on held-out train"
        )
    if model.gate is not None:
        metrics["gate_open_rate"] = float(test["mask"].mean())
        metrics["rows_all_closed"] = float((test["mask"].sum(1) == 0).mean())
    metrics["method"] = cfg.method.name
    metrics["n_test"] = int(len(test["labels"]))
    from bayesncl.report.figures import write_figures

    write_figures(test, cfg.data, run_dir)
    write_results(run_dir, "metrics", metrics, format_table({cfg.method.name: metrics}))
    return metrics


# ----------------------------------------------------------------------------- loading trained runs
def load_trained(
    source: str | Path, device: torch.device | None = None
) -> tuple[ContrastiveModel, Config, Path]:
    """Load a run dir (``config.yaml`` + ``last.pt``) or a bayesncl checkpoint file, safely.

    Checkpoints are read with ``torch.load(weights_only=True)``: a pickle that would run code is
    refused. Returns ``(model in eval mode, config, directory to write outputs into)``.
    """
    from bayesncl.config import config_from_dict
    from bayesncl.evaluation import EvalError

    src = Path(source)
    if src.is_dir():
        ckpt_path = src / "last.pt"
        if not ckpt_path.exists():
            raise EvalError(f"{src} holds no last.pt: not a bayesncl run dir")
        out_dir = src
    elif src.is_file():
        ckpt_path, out_dir = src, src.parent
    else:
        raise EvalError(f"{src}: no such run dir or checkpoint file")
    try:
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means "not a safe checkpoint"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise EvalError(
            f"{ckpt_path} is not a loadable checkpoint (refused by the safe loader: {first})"
        ) from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "config" not in ckpt:
        raise EvalError(f"{ckpt_path} is not a bayesncl checkpoint (expected keys 'config' and 'state_dict')")
    cfg = config_from_dict(ckpt["config"])
    info = dataset_info(cfg.data)
    model = build_model(cfg, info.channels, info.image_size, info.num_classes)
    missing, unexpected = model.load_state_dict(ckpt["state_dict"], strict=False)
    if missing or unexpected:
        raise EvalError(
            f"{ckpt_path} does not match the architecture in its config: "
            f"missing {len(missing)} keys (e.g. {missing[:2]}), unexpected {len(unexpected)} (e.g. {unexpected[:2]})"
        )
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), cfg, out_dir


def extract_command(source: str | Path, *, split: str = "test", out: str | Path | None = None) -> Path:
    """``bayesncl extract``: write ``features_<split>.npz`` (see docs/architecture.md)."""
    from bayesncl.evaluation.io import save_features

    model, cfg, out_dir = load_trained(source)
    device = next(model.parameters()).device
    arrays = extract_features(
        model, build_eval_loader(cfg.data, split, cfg.eval.batch_size, device=device), device
    )
    info = dataset_info(cfg.data)
    meta = {
        "method": cfg.method.name,
        "dataset": cfg.data.name,
        "split": split,
        "class_names": list(info.class_names),
        "source": str(source),
    }
    path = Path(out) if out else out_dir / f"features_{split}.npz"
    save_features(path, meta=meta, **arrays)
    return path


def evaluate_command(
    source: str | Path, *, retrieval_dims: str | None = None, knn: bool = True
) -> dict[str, Any]:
    """``bayesncl evaluate``: features → metrics, probe, kNN, retrieval, top-activation figure."""
    from bayesncl.evaluation.knn import knn_accuracy
    from bayesncl.evaluation.metrics import compute_all
    from bayesncl.evaluation.probe import linear_probe
    from bayesncl.report import format_table, write_results

    model, cfg, out_dir = load_trained(source)
    device = next(model.parameters()).device
    bs = cfg.eval.batch_size
    test = extract_features(model, build_eval_loader(cfg.data, "test", bs, device=device), device)
    train = extract_features(
        model, build_eval_loader(cfg.data, "train", bs, device=device), device, keys=("h",)
    )
    d = test["features"].shape[1]
    dims = (
        [int(k) for k in retrieval_dims.split(",")] if retrieval_dims else list(range(32, d + 1, 32)) or [d]
    )
    result: dict[str, Any] = compute_all(test["features"], test["labels"], retrieval_dims=dims)
    probe = linear_probe(train["h"], train["labels"], test["h"], test["labels"], seed=cfg.seed)
    result["linear_probe_acc1"], result["linear_probe_acc5"] = probe["acc1"], probe["acc5"]
    if knn:
        k = knn_accuracy(train["h"], train["labels"], test["h"], test["labels"])
        result["knn_acc1"] = k["acc1"]
    result["method"] = cfg.method.name
    write_results(out_dir, "evaluation", result, format_table({cfg.method.name: result}))
    from bayesncl.report.figures import write_figures

    write_figures(test, cfg.data, out_dir)
    print(format_table({cfg.method.name: result}))
    print(json.dumps({k: v for k, v in result.items() if k != "retrieval"}, indent=2, default=float))
    return result
