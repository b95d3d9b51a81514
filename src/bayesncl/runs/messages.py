"""What a run dir's checks and a stopped run say: :class:`RunDirError` (one line; :class:`RunDirBusy`
where another process trains there), :class:`TrainingInterrupted` and the message parts shared by the
checks."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from bayesncl.config import Config, diff_configs, flatten
from bayesncl.config.parse import RESUME_FREE_KEYS


class RunDirError(ValueError):
    """The run directory cannot be used as asked (exists, unwritable, config differs)."""


class RunDirBusy(RunDirError):
    """Another process holds the run dir's lock (``runs.lock.lock_run_dir``): it is training there.
    ``pid``: the holder's, as its lock file names it (``"unknown"`` where it wrote none)."""

    def __init__(self, message: str, pid: str) -> None:
        super().__init__(message)
        self.pid = pid

    def __reduce__(self) -> tuple[type[RunDirBusy], tuple[str, str]]:  # pickled to every rank whole
        return type(self), (str(self), self.pid)


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped by Ctrl-C or SIGTERM after saving a resumable ``last.pt`` (one-line message);
    ``exit_code`` is 128 + the signal number (130 for Ctrl-C, 143 for SIGTERM). ``template``: the
    message with ``{resume}`` where it says how to continue; ``str()`` reads ``--resume`` there, the
    app's error layer what the command takes (:data:`bayesncl.app.errors.RESUME_VIA`)."""

    def __init__(self, template: str, signum: int = signal.SIGINT) -> None:
        super().__init__(self.with_resume(template, "--resume"))
        self.template = template
        self.exit_code = 128 + int(signum)

    @staticmethod
    def with_resume(template: str, how: str) -> str:
        return template.replace("{resume}", how)  # not str.format: a path may hold braces


def _show(v: Any) -> str:
    return repr(v) if isinstance(v, str) else str(v)


def describe_config_diff(old: Config, new: Config, ignore: tuple[str, ...] = RESUME_FREE_KEYS) -> str:
    """``"key: old -> new; ..."`` for every key whose value differs (but ``ignore``: keys, or prefixes
    ending in ``.``; by default the resume-free keys)."""
    fo, fn = flatten(old.to_dict()), flatten(new.to_dict())
    return "; ".join(f"{k}: {_show(fo.get(k))} -> {_show(fn.get(k))}" for k in diff_configs(old, new, ignore))


def some_names(names: list[str], shown: int = 4) -> str:
    """``"a, b, c, d and 3 more"``: the first ``shown`` names of a list for a one-line message."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def occupied_run_dir(run_dir: Path) -> RunDirError:
    return RunDirError(
        f"run dir {run_dir} already holds a run; pass --resume to continue it, "
        "--overwrite to replace it, or choose another --run-dir"
    )


def resuming(run_dir: Path, state: Any) -> str:
    """``"resuming RUN from last.pt at epoch N (step S)"``: what ``--resume`` loaded (``state``: the
    restored ``runs.state.TrainState``), with how far into the next epoch a stop inside it had come."""
    inside = f", {state.cursor.n_seen} steps into epoch {state.epoch + 1}" if state.cursor else ""
    return f"resuming {run_dir} from last.pt at epoch {state.epoch} (step {state.step}{inside})"
