"""The steps ``demo`` and ``reproduce`` share: several variants (a config each) trained into the
sub-folders of one run dir, each reused once finished, then one table of them and their curves.

A variant's sub-run ``RUN_DIR/<name>`` is an ordinary pretrain run; it is *finished* once its
``metrics.json`` exists (written by :func:`save_metrics` after training and evaluation).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bayesncl.app.report import format_table, write_results
from bayesncl.config import Config, flatten, ignored
from bayesncl.config.parse import RESUME_FREE_KEYS

# What may differ between a finished run and this command's config for it to be reused, the one set
# for a run in a run dir (demo --resume, reproduce mechanism without --store) and in the store: what
# --resume may change but the length (train.epochs: a run of another length is another run). It holds
# every key of IDENTITY_IGNORES (below), so a run the store would reuse under its name is reused in a
# run dir too (a run dir's run was refused for another data.root, train.checkpoint_every or
# data.num_workers), and train.loggers and train.monitor_samples, which a run's name keeps but which
# cannot change its weights either (test_one_set_of_keys_a_finished_run_may_differ_in).
REUSE_IGNORES = tuple(k for k in RESUME_FREE_KEYS if k != "train.epochs")


def slug(name: str) -> str:
    """A variant's folder name: ``"BayesNCL (GS)"`` → ``"bayesncl-gs"``; ``"gate lr ×0.25"`` →
    ``"gate-lr-0-25"``."""
    return "-".join("".join(c if c.isascii() and c.isalnum() else " " for c in name.lower()).split())


def finished(sub: Path) -> bool:
    """Whether the variant in ``sub`` finished (trained and evaluated)."""
    return (sub / "metrics.json").exists()


def other_settings(sub: Path, cfg: Config, ignore: tuple[str, ...] = ()) -> str:
    """``"key: run's -> now; ..."`` for every key in which the run in ``sub`` (its config.yaml, else
    its last.pt) was configured otherwise than ``cfg``, beyond :data:`REUSE_IGNORES` and ``ignore``;
    ``""`` where none. ConfigError / RunDirError (one line) for a config that cannot be read."""
    from bayesncl.runs.export import load_run_config
    from bayesncl.runs.messages import describe_config_diff

    return describe_config_diff(load_run_config(sub), cfg, ignore=(*REUSE_IGNORES, *ignore))


def refuse_other_settings(
    sub: Path, cfg: Config, advice: str, *, ignore: tuple[str, ...] = (), prefix: str = ""
) -> None:
    """Raise RunDirError ``"{prefix}{sub} holds a finished run with other settings (key: run's ->
    now; ...); {advice}"`` when the finished run in ``sub`` was configured otherwise than ``cfg``
    (:func:`other_settings`)."""
    from bayesncl.runs.messages import RunDirError

    changed = other_settings(sub, cfg, ignore)
    if changed:
        raise RunDirError(
            f"{prefix}{sub} holds a finished run with other settings ({changed}; run's -> now); {advice}"
        )


def finished_metrics(
    sub: Path, who: str = "", advice: str = "", cfg: Config | None = None
) -> dict[str, Any]:
    """The metrics a finished variant saved (its ``metrics.json``, a JSON object). RunDirError (one
    line) for one that cannot be read (empty, not JSON, not an object: damaged, or cut short by a full
    disk): ``"{who}: its metrics.json cannot be read (why); {advice}"``, by default naming the run in
    ``sub`` and saying to move it away (its run is then trained again). With ``cfg`` (the config the
    command gives the run) the advice starts with the cheaper remedy where it applies
    (:func:`_reevaluate_advice`: delete metrics.json, and the run is evaluated again from its whole
    last.pt, without training). :func:`check_dirs` reads every finished run's so, before any training."""
    from bayesncl.runs.messages import RunDirError

    try:
        text = (sub / "metrics.json").read_text()
    except (OSError, UnicodeDecodeError) as e:
        why = f"{type(e).__name__}: {e}".splitlines()[0]
    else:
        try:
            metrics = json.loads(text)
        except json.JSONDecodeError as e:
            why = "it is empty" if not text.strip() else f"not JSON: {e.msg} at character {e.pos}"
        else:
            if isinstance(metrics, dict):
                return metrics
            why = f"it holds a JSON {type(metrics).__name__}, expected an object of metrics"
    who = who or f"the run {sub}"
    advice = advice or f"move {sub} away (its run is then trained again)"
    if cfg is not None:
        advice = _reevaluate_advice(sub, cfg) + advice
    raise RunDirError(f"{who}: its metrics.json cannot be read ({why}); {advice}")


def _reevaluate_advice(sub: Path, cfg: Config) -> str:
    """``"delete …/metrics.json (...), or "`` where the finished run in ``sub`` would be evaluated again
    without training once its metrics.json is gone: its ``last.pt`` reads as ``--resume`` reads it,
    records ``cfg``'s settings (but those ``--resume`` may change) and has done ``cfg``'s
    ``train.epochs`` whole (a table, ``demo --resume``: a run with a ``last.pt`` and no metrics.json is
    continued, and with no epoch left only evaluated); else ``""`` (the file is read whole: this is said
    only for a damaged metrics.json, which is rare)."""
    from bayesncl.config import ConfigError, build_config
    from bayesncl.runs.messages import describe_config_diff
    from bayesncl.runs.rundir import read_resume_checkpoint
    from bayesncl.runs.safe_load import CheckpointError

    if not (sub / "last.pt").is_file():  # (a packed run: nothing to evaluate)
        return ""
    try:
        ckpt = read_resume_checkpoint(sub / "last.pt")
        started = build_config(ckpt["config"], source=sub / "last.pt")
    except (CheckpointError, ConfigError):
        return ""
    if describe_config_diff(started, cfg) or ckpt.get("partial") or ckpt["epoch"] != cfg.train.epochs:
        return ""
    return (
        f"its last.pt is whole: delete {sub / 'metrics.json'} and the run is evaluated again from it (no "
        "training), or "
    )


def save_metrics(sub: Path, name: str, metrics: dict[str, Any]) -> None:
    """Write a variant's ``metrics.json``/``.md`` (what makes it finished)."""
    write_results(sub, "metrics", metrics, format_table({name: metrics}))


def link(run_dir: Path, name: str, target: Path) -> None:
    """``run_dir/name`` → the stored run (a relative symlink), so the table's folder shows its runs;
    skipped where something else is there or links cannot be made."""
    path = run_dir / name
    try:
        if path.is_symlink():
            path.unlink()
        if not path.exists():
            path.symlink_to(os.path.relpath(target, run_dir), target_is_directory=True)
    except OSError:
        pass


def check_dirs(
    run_dir: Path, store: Path | None, what: str, runs: dict[Path, tuple[str, Config]], *,
    links: tuple[str, ...] = (), unlinked: str = "", checkpoints: tuple[int, ...] = (),
    monitor: str = "", needs_weights: Callable[[Path], bool] | None = None, plan: bool = False,
) -> dict[Path, str]:
    """Everything ``reproduce`` and ``reproduce mechanism`` check of their folders before any output or
    training; raises RunDirError (one line) for

    - ``run_dir``, or ``store`` (None: the runs lie in ``run_dir``'s folders), that is a file, cannot
      be written, or holds a pretrain run (``what``, e.g. ``table 3``, names the command's runs);
    - a name of ``links`` (under ``run_dir``, each to link to a stored run) taken by a folder or file
      of its own, not a link (e.g. runs kept there before ``--store``; ``unlinked`` says so in the
      message): it would stay unlinked, beside a table of other runs;
    - a run's place (``runs``: ``{folder: (label, the config this command gives it)}``) taken by a file,
      or by a link to a folder that is no more;
    - a finished run of ``runs`` configured otherwise than :data:`REUSE_IGNORES` allows (in the run dir
      and in the store alike), or whose config or ``metrics.json`` cannot be read;
    - an unfinished run of ``runs`` (its ``last.pt``, which the command continues) that pretrain's
      ``--resume`` would refuse (:func:`_check_unfinished`: it was refused only when its turn came, with
      ``--resume``'s advice, which ``reproduce`` has no use for);
    - a finished stored run with its ``last.pt`` but without the ``epoch-NNNN.pt`` of ``checkpoints``,
      which only its training writes (where ``needs_weights(folder)`` says a measure not cached beside
      it reads them; without ``needs_weights``: always), or an unfinished run (in the store or not)
      without those of the epochs it has done (its continuation writes the rest; it was said only after
      that training, by the measure);
    - where the table reads the held-out monitor of the runs' ``log.csv`` (``monitor``: what of it, e.g.
      ncl-dead's per-epoch dead dims), a run, finished or not, that logged it with another
      ``train.monitor_samples`` or ``train.monitor_every`` than ``cfg`` (:func:`monitor_differs`): what
      :data:`REUSE_IGNORES` lets differ would change the table's values (monitor_samples: another
      held-out batch) or leave its rows empty (monitor_every: other epochs logged), which went silently;
    - a run's folder that cannot be written (a finished run's too: what a table measures of it is
      cached beside it);
    - finished runs without ``last.pt`` (their small files only: a store restored from
      ``benchmarks/long_queue.sh``'s packed runs, without checkpoints too) where
      ``needs_weights(folder)`` says a measure of the command, not yet cached beside the run, loads its
      weights (without ``needs_weights``: where ``checkpoints`` are read): :func:`weightless`, named all
      at once, before the other runs train (it was said after them, by the measure; a packed run was
      refused as one "another table trained with a larger train.checkpoint_every").

    With ``plan`` (``reproduce --plan``, ``--list-weightless``) the runs refused for weights or
    checkpoints they lack (the last two items) are returned instead, ``{folder: what it lacks}``
    (:func:`lacks_note`), and every other check raises as without it; without ``plan``: ``{}``."""
    from bayesncl.runs.layout import check_writable

    _check_places(run_dir, store, what, links, unlinked)
    # without a store, --store DIR is advice only while no run's folder is a real one: --store links its
    # stored runs where these folders are, and refuses a run dir that holds folders of its own there
    real = store is None and any(s.exists() and not s.is_symlink() for s in runs)
    def reads(sub: Path) -> bool:  # a measure reads the run's weights (None given: where checkpoints are)
        return needs_weights(sub) if needs_weights is not None else bool(checkpoints)

    lacking: dict[Path, str] = {}
    stored = store is not None
    for sub, (label, cfg) in runs.items():
        missing = _check_run(sub, label, cfg, stored, real, what, monitor, checkpoints, plan, reads)
        if missing:
            lacking[sub] = lacks_note(missing)
        check_writable(sub)  # a finished run too: what a table measures is cached beside it
    if plan:
        lacking.update((sub, lacks_note(None)) for sub in weightless(runs, reads))
        return {sub: lacking[sub] for sub in runs if sub in lacking}  # (in the runs' order)
    _check_weights(runs, store is not None, what, reads)
    return {}


def _check_places(
    run_dir: Path, store: Path | None, what: str, links: tuple[str, ...], unlinked: str
) -> None:
    """:func:`check_dirs`' checks of ``run_dir`` and ``store`` themselves (writable, no pretrain run in
    them) and of the ``links`` names under ``run_dir`` (none taken by a folder or file of its own);
    raises RunDirError (one line)."""
    from bayesncl.runs.layout import check_writable, refuse_a_run_in
    from bayesncl.runs.messages import RunDirError, some_names

    check_writable(run_dir)
    refuse_a_run_in(run_dir, what)
    if store is not None:
        try:
            check_writable(store)
            refuse_a_run_in(store, what)
        except RunDirError as e:  # the same checks, named for the store
            raise RunDirError(str(e).replace("run dir", "store", 1).replace("--run-dir", "--store")) from None
    own = [n for n in links if (run_dir / n).exists() and not (run_dir / n).is_symlink()]
    if own:
        dirs = sum((run_dir / n).is_dir() for n in own)
        kind = "folders" if dirs == len(own) else "files" if not dirs else "folders and files"
        raise RunDirError(
            f"run dir {run_dir} holds {kind} of its own where {what} links its stored runs "
            f"({some_names(own)}{unlinked}): they would stay there unlinked, beside a table of other runs; "
            "move them away, or choose another --run-dir"
        )


def _check_run(
    sub: Path, label: str, cfg: Config, stored: bool, real: bool, what: str, monitor: str,
    checkpoints: tuple[int, ...], plan: bool, reads: Callable[[Path], bool],
) -> list[int]:
    """:func:`check_dirs`' checks of one run's folder ``sub`` (``stored``: in the store; ``real``: the
    run dir holds real run folders, so ``--store`` is no advice); returns the epochs of
    ``checkpoints`` it lacks (``[]``: none), which raise RunDirError (one line) unless ``plan``."""
    # where a run cannot be reused or continued as it is: what to do
    if not stored:
        keeper, moved = "the run dir", f"move {sub} away"
        other = "or choose another --run-dir" if real else "choose another --run-dir, or pass --store DIR"
    else:
        keeper, moved, other = "the store", f"move {sub} out of the store", "or use another --store"
    place = f"{sub}, where {keeper} keeps this run,"
    _check_place(sub, label, place, f"{moved} (the run is then trained there), {other}")
    missing: list[int] = []
    if finished(sub):
        again = f"{moved} (its run is then trained again), {other}"
        _check_finished(sub, label, cfg, stored, again, (monitor, what))
        # (a run without last.pt, packed: named below with the others, for that cause)
        if stored and checkpoints and (sub / "last.pt").exists() and reads(sub):
            missing = missing_checkpoints(sub, checkpoints, None)
            if missing and not plan:
                run = f"the stored run {sub}"
                raise _need_checkpoints(missing, what, run, "trained", "use another --store")
    elif (sub / "last.pt").exists():  # the command continues it: what pretrain --resume checks
        restart = f"{moved} (its run is then trained from the start), {other}"
        done = _check_unfinished(sub, cfg, label, stored, restart, (monitor, what))
        # continuing it writes those of the epochs left only: said after its training
        missing = missing_checkpoints(sub, checkpoints, done)
        if missing and not plan:
            run = f"{sub}, an unfinished run this command would continue,"
            raise _need_checkpoints(missing, what, run, "began", restart)
    return missing


def weightless(runs: Iterable[Path], needs_weights: Callable[[Path], bool]) -> list[Path]:
    """The finished runs of ``runs`` (their folders) without ``last.pt`` (small files only: a store
    restored from ``benchmarks/long_queue.sh``'s packed runs) where ``needs_weights(folder)`` says a
    measure of the command, not yet cached beside the run, loads its weights: those the command refuses
    (:func:`check_dirs`), ``reproduce --plan`` marks and ``reproduce --list-weightless`` lists."""
    return [sub for sub in runs if finished(sub) and not (sub / "last.pt").exists() and needs_weights(sub)]


def lacks_note(missing: list[int] | None) -> str:
    """What a run lacks that the table reads, as ``reproduce --plan`` marks it: ``missing``, the epochs
    of the ``epoch-NNNN.pt`` it lacks, or None for its ``last.pt`` (:func:`weightless`)."""
    if missing is None:
        return "no last.pt: the table reads its weights"
    return f"no epoch-NNNN.pt of epoch(s) {', '.join(map(str, missing))}: the table reads them"


def _check_weights(
    runs: dict[Path, tuple[str, Config]], stored: bool, what: str, needs_weights: Callable[[Path], bool]
) -> None:
    """:func:`check_dirs` on the finished runs without ``last.pt``: RunDirError naming them all (and
    what to do) where ``needs_weights(folder)`` says a measure of ``what`` would load the run's weights
    (:func:`weightless`)."""
    from bayesncl.runs.messages import RunDirError, some_names

    named = [f"{runs[sub][0]} ({sub})" for sub in weightless(runs, needs_weights)]
    if named:
        where = ("move them out of the store (their runs are then trained again), or use another --store"
                 if stored else "move them away (their runs are then trained there), or choose another "
                 "--run-dir")  # fmt: skip
        raise RunDirError(
            f"{what} measures its runs from their weights, but {len(named)} finished run(s) have no "
            f"last.pt (small files only, as a packed store restores them): {some_names(named, 3)}; "
            f"{where}"
        )


def _check_finished(
    sub: Path, label: str, cfg: Config, stored: bool, again: str, monitor: tuple[str, str]
) -> None:
    """:func:`check_dirs` on a finished run in ``sub`` (``stored``: in the store): RunDirError (one line:
    ``label``, the run, what is wrong, then ``again``: what to do) where its config or ``metrics.json``
    cannot be read, its settings differ from ``cfg`` beyond :data:`REUSE_IGNORES`, its held-out monitor
    differs where the table (``monitor``: what of it it reads, and the table) reads it."""
    from bayesncl.runs.messages import RunDirError, describe_config_diff

    read, what = monitor
    who = f"{label}: the stored run {sub}" if stored else f"{label}: {sub}"
    stored_cfg = _run_config(sub, who, again)
    # what reusing it reads (read when its turn came, after the runs before it had trained)
    finished_metrics(sub, who, again, cfg)
    changed = describe_config_diff(stored_cfg, cfg, ignore=REUSE_IGNORES)
    if changed and not stored:
        raise RunDirError(
            f"{label}: {sub} holds a finished run with other settings ({changed}; run's -> now); {again}"
        )
    if changed:
        raise RunDirError(
            f"{label}: the stored run {sub} was trained with other settings ({changed}; stored -> now): "
            f"{again}"
        )
    run = f"{label}: the {'stored ' if stored else ''}run {sub}"
    _refuse_monitor(stored_cfg, cfg, read, run, what, again)


def _check_place(sub: Path, label: str, place: str, advice: str) -> None:
    """RunDirError (one line: ``label``, ``place``: the run's folder and whose it is, then ``advice``)
    where a run's folder ``sub`` is a file, or a link to a folder that is no more (moved or deleted)."""
    from bayesncl.runs.messages import RunDirError

    if sub.is_symlink() and not sub.exists():
        raise RunDirError(f"{label}: {place} is a link to {os.readlink(sub)}, which does not exist: {advice}")
    if sub.exists() and not sub.is_dir():
        raise RunDirError(f"{label}: {place} is a file, not a folder: {advice}")


def missing_checkpoints(sub: Path, checkpoints: tuple[int, ...], done: int | None) -> list[int]:
    """The epochs of ``checkpoints`` (those up to epoch ``done``; None: all) whose ``epoch-NNNN.pt``
    the run in ``sub`` lacks."""
    due = [e for e in checkpoints if done is None or e <= done]
    return [e for e in due if not (sub / f"epoch-{e:04d}.pt").exists()]


def _need_checkpoints(missing: list[int], what: str, run: str, verb: str, advice: str) -> Exception:
    """RunDirError (one line) for a run that lacks the ``epoch-NNNN.pt`` of the epochs ``missing``
    (:func:`missing_checkpoints`) that ``what`` (the table) reads: ``run`` names the run, ``verb`` what
    another table did to it ("trained", "began"), ``advice`` the way out besides running ``what`` first."""
    from bayesncl.runs.messages import RunDirError

    return RunDirError(
        f"{what} needs epoch-NNNN.pt of epochs {', '.join(map(str, missing))} but {run} has none "
        f"(another table {verb} it with a larger train.checkpoint_every): run {what} before the tables "
        f"that share its runs, or {advice}"
    )


def _check_unfinished(
    sub: Path, cfg: Config, label: str, stored: bool, restart: str, monitor: tuple[str, str] = ("", "")
) -> int:
    """RunDirError (one line: ``label``, the run in ``sub``, what is wrong, then ``restart``: what to do)
    where continuing the unfinished run in ``sub`` to ``cfg`` would fail: its ``last.pt`` does not read
    as ``--resume`` reads it (empty, truncated, a folder, not a bayesncl checkpoint, an entry missing),
    or records other settings than ``cfg`` (but those ``--resume`` may change), or more epochs begun
    than ``cfg``'s ``train.epochs``, or (``monitor``: what of the held-out monitor the table reads, and
    the table) another held-out monitor, which continuing it would mix into its ``log.csv``. Its turn
    came after the runs before it had trained, and ``--resume``'s advice is no advice for ``reproduce``,
    which has none. Returns the epochs it has done whole (:func:`check_dirs` checks their
    ``epoch-NNNN.pt``: continuing it writes those of the epochs left only). The whole file is read, as
    ``--resume`` reads it: an unfinished run is rare (one killed in training) and is then trained, which
    takes far longer."""
    from bayesncl.config import ConfigError, build_config
    from bayesncl.runs.messages import RunDirError, describe_config_diff
    from bayesncl.runs.rundir import epochs_begun, read_resume_checkpoint
    from bayesncl.runs.safe_load import CheckpointError

    where, ours = (f"the store's folder {sub}", "stored") if stored else (str(sub), "run's")
    try:
        ckpt = read_resume_checkpoint(sub / "last.pt")
        started = build_config(ckpt["config"], source=sub / "last.pt")
    except (CheckpointError, ConfigError) as e:
        why = getattr(e, "reason", str(e))  # (NotACheckpoint: what the file is, without a reader's advice)
        raise RunDirError(
            f"{label}: {where} holds an unfinished run whose last.pt cannot be read ({why}), so this command "
            f"cannot continue it: {restart}"
        ) from None
    changed = describe_config_diff(started, cfg)
    if changed:
        raise RunDirError(
            f"{label}: {where} holds an unfinished run (last.pt) started with other settings "
            f"({changed}; {ours} -> now), which this command would continue: {restart}"
        )
    _refuse_monitor(started, cfg, monitor[0], f"{label}: {where} holds an unfinished run (last.pt) that",
                    monitor[1], restart)
    begun, done = epochs_begun(ckpt)
    if cfg.train.epochs < begun:
        raise RunDirError(
            f"{label}: {where} holds an unfinished run (last.pt) that this command would continue to "
            f"train.epochs={cfg.train.epochs}, but {done}: give train.epochs >= {begun}, or {restart}"
        )
    return int(ckpt["epoch"])


MONITOR_KEYS = ("train.monitor_samples", "train.monitor_every")
"""What a run's held-out monitor (``log.csv``'s ``heldout_*`` columns) depends on beyond the weights:
the held-out images it scores and the epochs it scores them at."""


def monitor_differs(run: Config, cfg: Config) -> tuple[str, str]:
    """``("key: run's -> cfg's; ...", "key=run's ...")`` for the :data:`MONITOR_KEYS` in which the run
    configured ``run`` logged its held-out monitor otherwise than ``cfg`` would, ``("", "")`` where
    none: what differs, and the ``key=value`` words that give the run's."""
    a, b = flatten(run.to_dict()), flatten(cfg.to_dict())
    keys = [k for k in MONITOR_KEYS if a.get(k) != b.get(k)]
    changed = "; ".join(f"{k}: {a.get(k)} -> {b.get(k)}" for k in keys)
    return changed, " ".join(f"{k}={a.get(k)}" for k in keys)


def _refuse_monitor(run: Config, cfg: Config, reads: str, who: str, what: str, advice: str) -> None:
    """RunDirError ``"{who} logged ... : give key=value, or {advice}"`` where ``reads`` (what of the
    held-out monitor ``what``, the table, reads; ``""``: none) and the run configured ``run`` logged
    that monitor otherwise than ``cfg`` (:func:`monitor_differs`)."""
    from bayesncl.runs.messages import RunDirError

    changed, words = monitor_differs(run, cfg) if reads else ("", "")
    if changed:
        raise RunDirError(
            f"{who} logged its held-out monitor with other settings ({changed}; run's -> now), and {what} "
            f"reads {reads} from it: give {words} (the run's), or {advice}"
        )


def _run_config(sub: Path, who: str, advice: str) -> Config:
    """The config of the run in ``sub`` (:func:`bayesncl.runs.export.load_run_config`: its config.yaml,
    else its last.pt's); RunDirError ``"{who} ...; {advice}"`` (``who`` names the run) where it cannot
    be read (a metrics.json without either, a damaged config.yaml, ...)."""
    from bayesncl.config import ConfigError
    from bayesncl.runs.export import load_run_config
    from bayesncl.runs.messages import RunDirError
    from bayesncl.runs.safe_load import CheckpointError

    if not (sub / "config.yaml").exists() and not (sub / "last.pt").exists():
        raise RunDirError(
            f"{who} holds metrics.json but neither config.yaml nor last.pt, so its settings cannot be "
            f"checked; {advice}"
        )
    try:
        return load_run_config(sub)
    except (ConfigError, CheckpointError, RunDirError) as e:
        raise RunDirError(
            f"{who}: its settings cannot be read ({e}); {advice}"
        ) from None


def training(sub: Path) -> str:
    """What :func:`train_run` does with ``sub``, as every table and the mechanism study say it:
    ``"continuing"`` (its ``last.pt``) or ``"training"``."""
    return "continuing" if (sub / "last.pt").exists() else "training"


def train_run(cfg: Config, sub: Path) -> dict[str, Any]:
    """Pretrain the run ``cfg`` into ``sub`` (a table's or the mechanism study's): continued from its
    ``last.pt`` (checked up front by :func:`check_dirs`), else trained from the start, over what a run
    cut short before it left (a ``config.yaml``, a ``log.csv`` without a ``last.pt``: nothing to
    continue). Returns pretrain's metrics."""
    from bayesncl.app.train import pretrain

    resume = (sub / "last.pt").exists()
    return pretrain(cfg, sub, resume=resume, overwrite=not resume and sub.exists())


def write_table(
    run_dir: Path, stem: str, results: dict[str, dict[str, Any]], markdown: str, header: str,
    curves: dict[str, Path], report: bool = True, cfg: Config | None = None, heading: str = "",
) -> None:
    """Write the variants' table ``run_dir/{stem}.md``/``.json``, the training curves of
    ``curves`` (``{label: sub-run with a log.csv}``), if any, as ``run_dir/curves.png``, and the
    HTML report of the variants as ``run_dir/report/`` (:func:`write_report`, headed ``heading``,
    default ``stem``, with ``header`` and a link to the table; ``cfg``: a config this command gives its
    runs; ``report=False``: none, for a table of encoders trained elsewhere)."""
    from bayesncl.app.report.curves import write_training_curves

    write_results(run_dir, stem, results, markdown, header=header)
    if curves:
        write_training_curves(list(curves.values()), run_dir / "curves.png", labels=list(curves))
    if report:  # the runs in the table's order, so that each keeps its curves.png colour
        write_report(list(curves.values()) or [run_dir], run_dir / "report", cfg, heading=heading or stem,
                     intro=header, table=f"../{stem}.md")


def write_report(
    runs: list[Path], out: Path, cfg: Config | None, *, heading: str = "", intro: str = "", table: str = "",
    figure: str = "",
) -> None:
    """The HTML report of a table's ``runs`` into ``out`` (its path printed; one that cannot be written:
    a one-line warning), each run's data read under the command's ``data.root`` (``cfg``: a config it
    gives its runs, :func:`measure_overrides`; every run of a command shares its root), as every measure
    reads it: a reused run recorded where its data lay when it trained. Packed runs (a store's results
    kept without checkpoints: :func:`~bayesncl.app.report.html.is_packed`), which a table reuses but a
    report cannot show, are left out with one line that says so and how to get their report (all of
    them: no report; it was a warning that the first "holds no run to report on"), and the page says
    so under ``intro`` (``heading``, ``intro``, ``table``, ``figure``: the page's,
    :func:`bayesncl.app.report.html.write_report`)."""
    from bayesncl.app.report.html import PACKED_ADVICE, is_packed, write_report_or_warn
    from bayesncl.runs.messages import some_names

    packed = [r for r in runs if is_packed(r)]
    shown = [r for r in runs if r not in packed]
    if packed:
        names = some_names([r.name for r in packed])
        what = "the table was made from packed runs" if not shown else f"left out {len(packed)} packed run(s)"
        line = f"{what} ({names}: stored results without a checkpoint or features); {PACKED_ADVICE}"
        print(f"HTML report: {'not written: ' if not shown else ''}{line}")
        intro = f"{intro} Left out of this page: {len(packed)} packed run(s) of the table ({names})."
    if shown:
        write_report_or_warn(shown, out, overrides=measure_overrides(cfg) if cfg is not None else (),
                             heading=heading, intro=intro.strip(), table=table, figure=figure)


# ----------------------------------------------------------------------------- the store of runs
# What a variant's identity leaves out: settings that cannot change the trained weights (how often
# epoch-NNNN.pt is kept, the progress bar, loader workers, where the data lies) and the evaluation
# settings (a table evaluates a stored run as it needs, caching what it computed beside the run).
IDENTITY_IGNORES = (
    "train.progress", "train.checkpoint_every", "data.num_workers", "data.root", "eval.",
    "train.monitor_every", "train.compile_mode",
)
# Keys held at one value in every identity, whatever the config says: ``train.compile`` (issue 46) computes
# the same step, only rounded otherwise (within fp32 tolerance per step: tests/core/test_compile.py), as
# ``train.device=auto`` on a GPU and on a CPU is the same run; so a compiled run is reused for an eager one
# and back. It was in the identity of the first stored runs as ``false``, so it is held there (leaving it
# out would rename every stored run). ``train.compile_mode`` is new, hence simply ignored above.
IDENTITY_HELD: dict[str, Any] = {"train.compile": False}
# Keys added after the store's first runs (7c83712), with the value that reproduces those runs: at
# that value a key is left out of the identity, so every run stored before it keeps its name. A new
# key that can change the weights is added here with its old behaviour's value.
ADDED_KEYS: dict[str, Any] = {
    "data.crop_interpolation": "bilinear",  # issue 26: the authors' bicubic crop as an option
    "data.augment": "default",  # issue 47: the authors' augmentation presets as an option
}


def named_overrides(overrides: list[str]) -> list[str]:
    """The ``key=value`` items of ``overrides`` that enter a run's name: not :data:`IDENTITY_IGNORES`
    (``data.root``, ``eval.*``, ...), not :data:`IDENTITY_HELD` (``train.compile``) and not
    ``data.name`` (a table's header names its data itself); what a table's header, JSON and figure say
    it was run with, in the order given (a key given twice: its last item, which is the one applied, at
    its first place)."""
    last = {o.split("=", 1)[0].strip(): o for o in overrides if "=" in o}
    return [o for k, o in last.items()
            if k != "data.name" and k not in IDENTITY_HELD and not ignored(k, IDENTITY_IGNORES)]


def identity(cfg: Config) -> dict[str, Any]:
    """The resolved config as flat dotted keys, without :data:`IDENTITY_IGNORES`, without the
    :data:`ADDED_KEYS` at their old value and with :data:`IDENTITY_HELD` at its value: what makes two
    runs the same run (the seed is one of its keys). ``train.precision`` ``auto`` and ``fast`` are held
    with what they resolve to on this machine (``core.optim.identity_precision``): ``auto:bf16`` /
    ``fast:bf16`` on a CPU with native bf16 or a bf16 GPU, ``fast:fp32`` on a CPU without, and plain
    ``auto`` where ``auto`` is fp32 (so
    every stored fp32 run keeps its name)."""
    ident = {
        k: IDENTITY_HELD.get(k, v) for k, v in flatten(cfg.to_dict()).items()
        if not ignored(k, IDENTITY_IGNORES) and not (k in ADDED_KEYS and ADDED_KEYS[k] == v)
    }
    if ident.get("train.precision") in ("auto", "fast"):  # what it resolves to here: bf16 is not fp32
        from bayesncl.core.optim import identity_precision

        ident["train.precision"] = identity_precision(ident["train.precision"], str(cfg.train.device))
    return ident


def variant_hash(cfg: Config) -> str:
    """A stable 12-hex-digit name for the run ``cfg`` describes: SHA-256 of :func:`identity` as
    sorted JSON. Equal for configs that differ only in :data:`IDENTITY_IGNORES`; the same across
    processes and machines (no Python ``hash``)."""
    import hashlib

    text = json.dumps(identity(cfg), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def files_only(measure: Callable[..., dict[str, float]]) -> Callable[..., dict[str, float]]:
    """Mark a study measure as reading a run's metrics.json, log.csv or config only, never its weights:
    a finished run restored without ``last.pt`` (``benchmarks/long_queue.sh``) can still be measured."""
    measure.files_only = True  # type: ignore[attr-defined]
    return measure


def weights_if(
    reads: Callable[[Path], bool]
) -> Callable[[Callable[..., dict[str, float]]], Callable[..., dict[str, float]]]:
    """Mark a study measure as loading a run's weights only where ``reads(run folder)`` is True (the
    soft gate's evaluation by α: soft-gated runs only); elsewhere it reads no file of the run."""

    def mark(measure: Callable[..., dict[str, float]]) -> Callable[..., dict[str, float]]:
        measure.weights_if = reads  # type: ignore[attr-defined]
        return measure

    return mark


def reads_weights(measure: Callable[..., dict[str, float]], sub: Path | None = None) -> bool:
    """Whether ``measure`` loads the weights of the run in ``sub`` (every measure not marked
    :func:`files_only`, or :func:`weights_if` where its test of ``sub`` says so; None: of some run)."""
    reads = getattr(measure, "weights_if", None)
    if reads is not None and sub is not None:
        return bool(reads(sub))
    return not getattr(measure, "files_only", False)


def read_cache(sub: Path) -> dict[str, Any]:
    """What tables computed from the stored run in ``sub`` (``reproduce.json``: ``{measure key:
    {metric: value}}``); empty when none yet or unreadable (it is recomputed)."""
    try:
        data = json.loads((sub / "reproduce.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_cache(sub: Path, cache: dict[str, Any]) -> None:
    """Write ``sub/reproduce.json`` atomically (see :func:`read_cache`)."""
    from bayesncl.app.report import write_json

    write_json(sub / "reproduce.json", cache)


# ----------------------------------------------------------------------------- measuring a stored run
def measure_overrides(cfg: Config) -> list[str]:
    """What every measure of a stored run sets on the config the run was trained with (its checkpoint's)
    before it reads data: this command's ``data.root`` (``cfg``'s), where the data lies now and where
    the command's checks before training read it. A run stored on another machine, or before its data
    moved, recorded another root; :data:`IDENTITY_IGNORES` leaves ``data.root`` out of a run's name, so
    the run is reused wherever its data lies. The one place that says so: measures load a stored run
    with :func:`load_stored`, or hand these overrides on (``dynamics``, ``finetune``)."""
    return [f"data.root={json.dumps(cfg.data.root)}"]


@contextmanager
def measuring(sub: Path, *, in_store: bool = True, label: str = "") -> Iterator[None]:
    """Around every measure of the finished run in ``sub`` that may load its weights (``reproduce``'s
    :func:`~bayesncl.paper.reproduce.measure`, the mechanism study's dynamics): a checkpoint of it that
    is missing or does not read (:class:`~bayesncl.app.evaluate.UnreadableCheckpoint`, from
    :func:`load_stored` and every loader a measure hands the run to: ``dynamics``, ``finetune``), which
    named only the file, becomes RunDirError naming the run (``label``: its name in the table) and what
    to do: move it out of the store (``in_store``; else away), so that its run is trained again."""
    from bayesncl.app.evaluate import UnreadableCheckpoint
    from bayesncl.runs.messages import RunDirError

    try:
        yield
    except UnreadableCheckpoint as e:
        who = f"the stored run {sub}" if in_store else str(sub)
        moved = f"move {sub} out of the store" if in_store else f"move {sub} away"
        raise RunDirError(
            f"{label + ': ' if label else ''}{who} is finished but its {e.path.name} {e.reason}, and "
            f"measuring it needs that: {moved} (its run is then trained again)"
        ) from None


def load_stored(path: Path, cfg: Config) -> tuple[Any, Config, Path]:
    """:func:`bayesncl.app.evaluate.load_trained` of a stored run (``path``: its folder, or one of its
    checkpoints ``epoch-NNNN.pt``) for a measure of this command (``cfg``: the config it gives the run),
    under :func:`measure_overrides`; a checkpoint missing or unreadable is named with the run inside
    :func:`measuring`."""
    from bayesncl.app.evaluate import load_trained

    return load_trained(path, overrides=measure_overrides(cfg))


def stored_features(sub: Path, cfg: Config) -> tuple[Any, Any]:
    """(train, test) FeatureSets of a stored run (h, z̃, labels), extracted once (the data read under
    this command's ``cfg``'s root: :func:`load_stored`) and kept as ``features_train.npz`` /
    ``features_test.npz`` beside it."""
    from bayesncl.app.evaluate import extract_split, save_split_features
    from bayesncl.runs.export import load_run_config
    from bayesncl.runs.features import load_features

    paths = {s: sub / f"features_{s}.npz" for s in ("train", "test")}
    if not all(p.exists() for p in paths.values()):
        model, loaded, _ = load_stored(sub, cfg)
        device = next(model.parameters()).device
        for split, path in paths.items():
            keys = ("h", "features") if split == "train" else ("h", "features", "alpha", "mask")
            extracted = extract_split(model, loaded, split, device, keys=keys)
            save_split_features(path, extracted, loaded, split, sub)
    threshold = load_run_config(sub).method.threshold  # an older file's α read at the run's gate threshold
    train, test = (load_features(paths[s], threshold=threshold) for s in ("train", "test"))
    if train.h is None or test.h is None:  # a features file written without h: extract again
        for p in paths.values():
            p.unlink()
        return stored_features(sub, cfg)
    return train, test
