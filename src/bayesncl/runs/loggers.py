"""Where a run's per-epoch numbers go besides ``log.csv``: ``train.loggers`` (default ``[csv]``).

``csv``: ``log.csv`` and ``steps.csv``, always written (the run's record). ``tensorboard``: event
files in ``RUN_DIR/tensorboard/`` (extra ``[tensorboard]``). ``wandb``: a W&B run in
``RUN_DIR/wandb/`` (extra ``[wandb]``), offline unless ``WANDB_MODE`` says otherwise, project
``WANDB_PROJECT`` or ``bayesncl``, its id kept in ``RUN_DIR/wandb-id.txt``. Each gets the log.csv
row's scalars at x = the epoch (``train/<column>``), the final metrics (``eval/<key>``) and the
figures (``figures/<name>``); ``--resume`` continues the same TensorBoard run (later events purged)
and W&B run id.
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bayesncl.config import ConfigError

FIGURES = ("training_curves.png", "top_activations.png", "sparsity.png", "suppressed_features.png")


class LoggerError(ConfigError):
    """A logger of ``train.loggers`` cannot run (its package is missing); one line."""


def require(names: Iterable[str]) -> None:
    """Raise LoggerError naming the extra to install (of the logger's name) for the first logger of
    ``names`` whose package is missing (checked before the run dir is touched)."""
    for name in names:
        if name == "csv":
            continue
        try:
            if name == "tensorboard":
                import tensorboard  # noqa: F401  (torch.utils.tensorboard needs it)
            else:
                import wandb  # noqa: F401
        except ImportError:
            raise LoggerError(
                f"train.loggers: {name} needs the {name} package: pip install "
                f"'bayesncl[{name}]' (or drop {name} from train.loggers)"
            ) from None


def _scalars(row: Mapping[str, Any], prefix: str) -> dict[str, float]:
    """The finite numbers of ``row`` as ``{prefix/key: float}`` (empty cells and strings left out)."""
    return {f"{prefix}/{k}": float(v) for k, v in row.items()
            if not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(float(v))}


def _png(path: Path) -> Any:
    import numpy as np
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


class RunLoggers:
    """The loggers of one run (rank 0). No-ops for ``[csv]`` alone: log.csv is written by the loop."""

    def __init__(self, names: Iterable[str], run_dir: Path, config: dict[str, Any], epoch: int) -> None:
        self.run_dir, self.tb, self.wb = Path(run_dir), None, None
        names = list(names)
        require(names)
        if "tensorboard" in names:
            from torch.utils.tensorboard import SummaryWriter

            # a resume drops events logged after the checkpoint's epoch (a run killed in between)
            purge = epoch + 1 if epoch else None
            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=purge)
        if "wandb" in names:
            self.wb = _wandb_run(self.run_dir, config)

    def log_epoch(self, row: Mapping[str, Any]) -> None:
        """The scalars of a log.csv row at x = its epoch."""
        step = int(row["epoch"])
        values = _scalars({k: v for k, v in row.items() if k != "epoch"}, "train")
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wb is not None:
            self.wb.log({**values, "epoch": step}, step=step)

    def finish(self, epoch: int, metrics: Mapping[str, Any] | None = None) -> None:
        """The final metrics and the run dir's figures at x = ``epoch``, then close."""
        values = _scalars(metrics or {}, "eval")
        figures = [self.run_dir / n for n in FIGURES if (self.run_dir / n).is_file()]
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(k, v, epoch)
            for f in figures:
                self.tb.add_image(f"figures/{f.stem}", _png(f), epoch, dataformats="HWC")
        if self.wb is not None:
            import wandb

            self.wb.log({**values, **{f"figures/{f.stem}": wandb.Image(str(f)) for f in figures}}, step=epoch)
        self.close()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wb is not None:
            self.wb.finish()
            self.wb = None


def _wandb_run(run_dir: Path, config: dict[str, Any]) -> Any:
    """A W&B run for ``run_dir``: the id in ``wandb-id.txt`` (a resume continues it), else a new one."""
    import wandb

    id_file = run_dir / "wandb-id.txt"
    run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
    id_file.write_text(run_id + "\n")
    return wandb.init(
        project=os.environ.get("WANDB_PROJECT", "bayesncl"), id=run_id, resume="allow", name=run_dir.name,
        dir=str(run_dir), config=config, mode=os.environ.get("WANDB_MODE", "offline"),
    )
