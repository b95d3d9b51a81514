"""The Python API behind ``import bayesncl`` (docs/api.md): the CLI's commands as functions.

Errors are the CLI's one-line exceptions (ConfigError, DataError, EvalError, ...), all
``ValueError`` subclasses, raised rather than printed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bayesncl.config import Config, ConfigError, build_config

__all__ = ["pretrain", "evaluate", "load_encoder"]  # and bayesncl.finetune: app.finetune.finetune


def default_run_dir(cfg: Config, prefix: str = "") -> Path:
    """``runs/<prefix><method>-<data>-<time>``: where a run goes without ``--run-dir``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{prefix}{cfg.method.name}-{cfg.data.name}-{stamp}"


def _with_python_data(cfg: Config, dataset: Any, eval_dataset: Any, labels: Any) -> tuple[Config, str]:
    """``cfg`` reading ``dataset`` (and ``eval_dataset``) held in this process: data.name=python,
    data.root its token, data.image_size its side (so the run's config records the geometry)."""
    from bayesncl.data import provided

    token = provided.provide(dataset, eval_dataset, image_size=cfg.data.image_size, labels=labels)
    size = cfg.data.image_size or provided.geometry(token)[1]
    data = {"data.name": "python", "data.root": token, "data.image_size": size, "data.classes": None}
    try:
        return build_config(cfg, data), token
    except ConfigError:
        provided.release(token)
        raise


def pretrain(
    config: Config,
    dataset: Any = None,
    run_dir: str | Path | None = None,
    *,
    eval_dataset: Any = None,
    labels: Any = None,
    evaluate: bool = True,
    resume: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """``bayesncl pretrain``: train ``config`` into ``run_dir`` (default ``runs/METHOD-DATA-TIME``)
    and evaluate it; returns the metrics (``{}`` with ``evaluate=False``).

    ``dataset``: instead of ``data.*``, a torch Dataset whose items are ``(image, label)`` or an
    image alone (PIL, (C, H, W) tensor, uint8 array), or a uint8 tensor N x C x H x W (``labels``:
    its int labels, optional); read once and held resident like the built-in datasets.
    ``eval_dataset``: the same for the end-of-training evaluation (else ``eval.data.*``; with
    neither, pass ``evaluate=False``). Images of mixed sizes need ``data.image_size``. Raises
    ConfigError / DataError (one line) before training for bad input."""
    from bayesncl.app.train import pretrain as train

    if isinstance(dataset, (str, Path)) and run_dir is None:  # pretrain(cfg, "runs/x"): app.train's order
        dataset, run_dir = None, dataset
    if not isinstance(config, Config):
        raise ConfigError(
            f"config: got a value of type {type(config).__name__}; expected bayesncl.build_config([...])"
        )
    if dataset is None and (eval_dataset is not None or labels is not None):
        raise ConfigError("eval_dataset= and labels= go with dataset=")
    token = None
    if dataset is not None:
        config, token = _with_python_data(config, dataset, eval_dataset, labels)
    try:
        run = Path(run_dir) if run_dir is not None else default_run_dir(config)
        return train(config, run, resume=resume, overwrite=overwrite, evaluate=evaluate)
    finally:
        if token is not None:
            from bayesncl.data import provided

            provided.release(token)


def evaluate(
    source: str | Path,
    overrides: list[str] | None = None,
    *,
    dataset: Any = None,
    eval_dataset: Any = None,
    **options: Any,
) -> dict[str, Any]:
    """``bayesncl evaluate SOURCE key=value ...``: metrics, linear probe, kNN, retrieval of a run
    dir or checkpoint; returns the result dict (also written beside it). ``dataset`` /
    ``eval_dataset``: labelled data from Python (train split for the probe / test split), as for
    :func:`pretrain`. ``options``: :func:`bayesncl.app.evaluate.evaluate_command`'s (``probe``,
    ``knn``, ``retrieval_dims``, ``probe_seeds``)."""
    from bayesncl.app.evaluate import evaluate_command
    from bayesncl.data import provided

    overrides = list(overrides or [])
    token = None
    if dataset is not None:
        token = provided.provide(dataset, eval_dataset)
        overrides += ["data.name=python", f"data.root={token}"]
    try:
        return evaluate_command(source, overrides=overrides, **options)
    finally:
        if token is not None:
            provided.release(token)


def load_encoder(
    run_dir_or_file: str | Path, device: str | torch.device | None = None, overrides: list[str] | None = None
) -> nn.Module:
    """The trained model of a run dir (its ``last.pt``, else its ``encoder.safetensors``), a
    checkpoint or an ``encoder.safetensors``, in eval mode, without reading any data (``device``:
    default CUDA where there is one). An official BayesNCL/NCL checkpoint, or ``overrides``
    (``data.*``), go through :func:`bayesncl.app.evaluate.load_trained`, which reads the data.

    Returns a :class:`bayesncl.core.model.ContrastiveModel`: ``model(x)`` maps normalised images
    x: (B, C, S, S) to a ModelOutput (``.h`` (B, H) backbone features, ``.z_tilde`` (B, D) the
    evaluation features); ``model.backbone`` is the encoder f alone. Raises EvalError (one line)."""
    from bayesncl.app.evaluate import _encoder_config, _is_own_encoder, load_trained
    from bayesncl.core.model import build_model
    from bayesncl.metrics.inputs import EvalError
    from bayesncl.runs.official import load_state_strict
    from bayesncl.runs.safe_load import CheckpointError, is_bayesncl_checkpoint, load_checkpoint_file

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    path = Path(run_dir_or_file)
    if overrides:
        return load_trained(path, torch.device(device), overrides)[0]
    if path.is_dir():
        path = next((path / f for f in ("last.pt", "encoder.safetensors") if (path / f).is_file()), path)
    try:
        obj = load_checkpoint_file(path)
    except CheckpointError as e:
        raise EvalError(f"{e} (expected a run dir, a checkpoint or an encoder.safetensors)") from None
    if is_bayesncl_checkpoint(obj):
        cfg_dict, state = obj["config"], obj["state_dict"]
    elif _is_own_encoder(path, obj):
        cfg_dict, state = _encoder_config(path)[0], obj
    else:  # an official checkpoint (it records no data: load_trained asks for data.name=...)
        return load_trained(path, torch.device(device), overrides)[0]
    cfg = build_config(cfg_dict, source=path)
    channels, size = _geometry(cfg, state)
    head = state.get("classifier.weight")
    model = build_model(cfg, channels, size, int(head.shape[0]) if head is not None else 1)
    try:
        load_state_strict(model, state, str(path), "the architecture its config describes")
    except ValueError as e:
        raise EvalError(str(e)) from None
    return model.to(device).eval()


def _geometry(cfg: Config, state: dict[str, torch.Tensor]) -> tuple[int, int]:
    """(channels, side) the model was built for: the channels of the backbone's first conv (or patch
    embedding) weight, the side from the config (``data.image_size``, else the dataset's native one)."""
    from bayesncl.data.sources import NATIVE_SIZE

    first = next((v for k, v in state.items() if k.startswith("backbone.") and v.ndim == 4), None)
    channels = int(first.shape[1]) if first is not None else 3
    return channels, cfg.data.image_size or NATIVE_SIZE.get(cfg.data.name, 224)
