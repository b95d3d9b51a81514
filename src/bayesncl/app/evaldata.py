"""Which data evaluation reads: the training data with its labels, or ``eval.data.*``.

An unlabeled pretraining set (``data.labels=none``, an image folder without class folders, a
Python dataset of images alone) has no labels to evaluate with; ``eval.data.*`` names a labelled
dataset instead, which is also how an encoder trained elsewhere is evaluated
(``bayesncl evaluate CKPT eval.data.name=imagefolder eval.data.root=DIR``).
"""

from __future__ import annotations

import dataclasses

from bayesncl.config import Config, eval_data
from bayesncl.data import DataError, DatasetInfo


def with_eval_data(cfg: Config) -> Config:
    """``cfg`` with ``data`` replaced by the data evaluation reads (:func:`bayesncl.config.eval_data`)."""
    return dataclasses.replace(cfg, data=eval_data(cfg))


def _what(cfg: Config) -> str:
    d = cfg.data
    if d.name == "python":
        return "the dataset handed over from Python"
    if d.labels == "none":
        return f"{d.name} with data.labels=none"
    return f"data.root={d.root} (an image folder without class folders)" if d.root else d.name


def no_labels_note(cfg: Config, run_dir: object, info: DatasetInfo) -> str | None:
    """The line ``pretrain`` prints instead of evaluating when the training data has no labels (or no
    test split) and no ``eval.data.*`` was asked for, saying how to evaluate ``run_dir`` later; None
    when there is labelled data to evaluate with, or when ``eval.data.name`` asks for some (that
    request is checked by :func:`check_eval_data`, which refuses one that cannot be met)."""
    if cfg.eval.data.name or (info.labeled and info.num_test > 0):
        return None
    how = (
        f"bayesncl.evaluate('{run_dir}', dataset=...) with labelled data" if cfg.data.name == "python"
        else f"`bayesncl evaluate {run_dir} eval.data.name=NAME eval.data.root=DIR` with a labelled dataset"
    )
    return (
        f"no end-of-training evaluation: {_what(cfg)} has no labels (or no test split); evaluate with {how}"
    )


def check_eval_data(
    cfg: Config, train_info: DatasetInfo, info: DatasetInfo, command: str = "pretrain"
) -> None:
    """Refuse the data evaluation reads (``info``: its DatasetInfo) before training when it has no
    labels or another channel count than the training data. ``command``: named in the advice.
    Raises DataError (one line)."""
    if not info.labeled or (info.num_test == 0 and not cfg.eval.data.name):
        src = _what(cfg) if not cfg.eval.data.name else f"eval.data.name={cfg.eval.data.name}"
        python = cfg.data.name == "python"
        skip = {"pretrain": ", or pass --no-eval (evaluate=False in Python)",
                "python": ", or pass evaluate=False"}.get("python" if python else command, "")
        where = "pass eval_dataset= (labelled), or set eval.data.name and eval.data.root" if python else (
            "set eval.data.name and eval.data.root to a labelled dataset"
        )
        raise DataError(f"{src} has no labels (or no test split) to evaluate with: {where}{skip}")
    if info.channels != train_info.channels:
        raise DataError(
            f"eval.data.name={cfg.eval.data.name} has {info.channels}-channel images, the training data "
            f"{train_info.channels}-channel ones: evaluate on data with {train_info.channels} channel(s)"
        )
