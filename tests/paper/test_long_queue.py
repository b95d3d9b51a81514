"""``benchmarks/long_queue.sh``: before each table of its QUEUE it sets aside (into
``$STORE/no-weights/``) exactly the runs that table lists with ``reproduce ... --list-weightless``, the
runs it would refuse for want of their weights, and then runs the table. Run here against a temporary
store with a stub ``$PYTHON`` that logs each call (and, for ``--list-weightless``, prints what the test
gives it), so no table trains."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

QUEUE_SH = Path(__file__).parents[2] / "benchmarks" / "long_queue.sh"

# the stub: one line a call in $CALLS ("<args> | <runs in the store's variants/>"); for
# --list-weightless of the job named in $LIST_JOB, $LIST_OUT (exit $LIST_RC)
STUB = """#!/usr/bin/env bash
[ "$1" = -c ] && exec "$REAL_PY" "$@"  # the queue's own snippet (best_cell's): the real Python
echo "$* | $(ls "$STORE/variants" 2>/dev/null | tr '\\n' ' ')" >> "$CALLS"
case " $* " in
    *" --finished "*)  # best_cell's table of Fig. 4(b) so far: $FIG4B (JSON) into its --run-dir
        while [ "$1" != --run-dir ]; do shift; done
        [ -n "$FIG4B" ] && printf '%s' "$FIG4B" > "$2/fig4b.json"
        exit 0 ;;
    *" --list-weightless "*)
        [ "$6" = "$LIST_JOB" ] || exit 0  # -m bayesncl reproduce --seeds 3 JOB ...
        [ "$LIST_RC" = 0 ] || { echo "bayesncl: error: a listing that fails" >&2; exit "$LIST_RC"; }
        printf '%s' "$LIST_OUT" ;;
esac
exit 0
"""


def _queue(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``bash benchmarks/long_queue.sh ARGS`` on ``tmp_path/store`` (results packed into
    ``tmp_path/packed``): its output and the stub's calls."""
    stub = tmp_path / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    calls = tmp_path / "calls"
    calls.unlink(missing_ok=True)
    full = {**os.environ, "STORE": str(tmp_path / "store"), "SEEDS": str(tmp_path / "packed"),
            "PYTHON": str(stub), "CALLS": str(calls), "LIST_JOB": "", "LIST_OUT": "", "LIST_RC": "0",
            "REAL_PY": sys.executable, "FIG4B": "", **env}  # fmt: skip
    done = subprocess.run(["bash", str(QUEUE_SH), *args], env=full, capture_output=True, text=True,
                          timeout=120)
    return done, calls.read_text().splitlines() if calls.exists() else []


def _queue_jobs() -> list[str]:
    """The jobs of the script's QUEUE (its ``L=`` and ``QUEUE=(...)`` lines, evaluated by bash)."""
    lines = QUEUE_SH.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("L="))
    end = next(i for i, line in enumerate(lines) if i > start and line == ")")
    script = "\n".join([*lines[start : end + 1], 'printf "%s\\n" "${QUEUE[@]}"'])
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def _run(store: Path, h: str, weights: bool = False) -> Path:
    """A finished stored run (its small files; ``weights``: and a last.pt)."""
    sub = store / "variants" / h
    sub.mkdir(parents=True)
    for f in ("config.yaml", "metrics.json", "reproduce.json"):
        (sub / f).write_text("{}")
    if weights:
        (sub / "last.pt").write_bytes(b"")
    return sub


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_run_sets_aside_what_each_table_lists_before_running_it(tmp_path: Path) -> None:
    """Before each job the queue asks the table for its weightless runs and moves exactly those; a run
    it does not list stays, whether it has last.pt or not (its reproduce.json caches what the table
    reads: the hard-coded `again` lists retrained such runs), and a listed hash not in the store is
    said in one line. A listing that fails moves nothing and the table still runs (and says why)."""
    store = tmp_path / "store"
    listed = _run(store, "aaaaaaaaaaaa")  # the second job reads its weights: no last.pt
    cached = _run(store, "cccccccccccc")  # no last.pt either, but the job did not list it
    whole = _run(store, "dddddddddddd", weights=True)
    shutil.copytree(listed, tmp_path / "packed" / "variants" / listed.name)  # packed by an earlier queue
    done, calls = _queue(tmp_path, "run", LIST_JOB="fig4b", LIST_OUT="aaaaaaaaaaaa\nbbbbbbbbbbbb\n")
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert f"again: set aaaaaaaaaaaa aside in {store}/no-weights/: the next table that reads it trains it " \
        "again" in out
    assert f"again: no run bbbbbbbbbbbb in {store}/variants/: nothing set aside" in out
    assert sum(line.startswith("again: ") for line in out) == 2
    assert (store / "no-weights" / "aaaaaaaaaaaa" / "metrics.json").exists() and not listed.exists()
    assert cached.is_dir() and (whole / "last.pt").exists()
    # each job: its listing, then the table, in QUEUE's order; the listed job's table after the move
    jobs = [c.split(" | ")[0] for c in calls if " --finished " not in c + " "]  # best_cell's: below
    queue = _queue_jobs()
    assert len(queue) >= 3 and not [j for j in queue if j.startswith("again")]  # no hard-coded `again` left
    assert queue[0].startswith("fig4b ")  # issue 44's
    # the jobs at the best cell of Fig. 4(b) are skipped while it has no best cell (the stub gives none)
    plain = [j for j in queue if "@BEST" not in j]
    assert len(plain) < len(queue)
    for j in queue:
        skipped = f"=== skipped {j}: Fig. 4(b) has runs not finished, so no best cell yet" in out
        assert skipped == ("@BEST" in j)
    # the default --seeds 3 first: a job's own --seeds (fig4b's 1) comes later and wins
    assert jobs[1::2] == [f"-m bayesncl reproduce --seeds 3 {j} --store {store}/variants" for j in plain]
    assert any(j.startswith("fig4b ") and j.endswith(" --seeds 1 method.lam=3e-05") for j in queue)
    assert jobs[::2] == [f"{j} --list-weightless" for j in jobs[1::2]]
    fig4b = [c for c in calls if c.startswith("-m bayesncl reproduce --seeds 3 fig4b ")]
    assert len(fig4b) == 2 and "aaaaaaaaaaaa" in fig4b[0] and "aaaaaaaaaaaa" not in fig4b[1]  # listed, moved
    # packed before it was set aside: restore leaves it out (its table trains it)
    assert sorted(p.name for p in (tmp_path / "packed" / "variants").iterdir()) == [
        "aaaaaaaaaaaa", "cccccccccccc", "dddddddddddd"]  # fmt: skip
    done, _ = _queue(tmp_path, "restore")
    left = f"restore: left out aaaaaaaaaaaa: set aside in {store}/no-weights/ to be trained again"
    assert left in done.stdout.splitlines()
    assert not listed.exists()
    # a listing that fails: nothing moved, said on stderr, the table runs
    done, calls = _queue(tmp_path, "run", LIST_JOB="fig4b", LIST_OUT="cccccccccccc\n", LIST_RC="2")
    assert done.returncode == 0 and cached.is_dir()
    assert "again: could not list what fig4b --dataset fashion-mnist-long train.precision=fp32 --seeds 1 " \
        "method.lam=3e-05 would refuse (its run below says why)" in done.stderr
    assert "bayesncl: error: a listing that fails" in done.stderr
    assert any(c.startswith("-m bayesncl reproduce --seeds 3 fig4b ") and "--list-weightless" not in c
               for c in calls)


def _fig4b(sc: dict[str, float | None], missing: bool = False) -> str:
    """The JSON of ``reproduce fig4b --finished``: its rows' SC (None: no value), ``missing`` runs."""
    rows = {k: {"semantic_consistency": {"mean": v}, "linear_probe_acc1": {"mean": 90.0}}
            for k, v in sc.items()}  # fmt: skip
    return json.dumps({"rows": rows, **({"missing": {"rho=0.9 lambda=3e-05 seed 0": "eeeeeeeeeeee"}}
                                       if missing else {})})  # fmt: skip


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_jobs_at_the_best_cell_read_fig4bs_highest_sc_once_every_run_finished(tmp_path: Path) -> None:
    """@BEST@ in a job is the Fig. 4(b) cell of the highest SC (not LP@1, not a cell without SC), as
    method.rho=R method.lam=X, and @BEST_LAM@ its λ alone, read from ``reproduce fig4b --finished`` of
    the packed runs ($SEEDS) when each job starts; while a run of Fig. 4(b) is missing those jobs are
    skipped."""
    sc = {"rho=0.8 lambda=3e-06": 63.6, "rho=0.3 lambda=0.0001": 66.4, "rho=0.8 lambda=0.001": None,
          "rho=0.3 lambda=0.0003": 56.6}  # fmt: skip
    done, calls = _queue(tmp_path, "run", FIG4B=_fig4b(sc))
    assert done.returncode == 0, done.stderr
    jobs = [c.split(" | ")[0] for c in calls]
    head, tail = "-m bayesncl reproduce --seeds 3 ", f" --store {tmp_path}/store/variants"
    tables = [j.removeprefix(head).removesuffix(tail) for j in jobs
              if j.startswith(head) and j.endswith(tail)]
    best = [_queue_jobs()[i] for i, j in enumerate(_queue_jobs()) if "@BEST" in j]
    cell = "method.rho=0.3 method.lam=0.0001"
    want = [j.replace("@BEST_LAM@", "method.lam=0.0001").replace("@BEST@", cell) for j in best]
    assert [t for t in tables if t in want] == want and "skipped" not in done.stdout
    assert "fig4b --dataset fashion-mnist-long train.precision=fp32 --seeds 1 method.lam=0.0001" in tables
    assert f"headline --dataset fashion-mnist-long train.precision=fp32 {cell}" in tables
    finished = [j for j in jobs if " --finished" in j]
    assert len(finished) == len(best) and all(" fig4b " in j and "method.lam=3e-05" in j for j in finished)
    # the packed runs (git's), not the store, where fig3 trains a Fig. 4(b) run again from the start
    assert all(f" --store {tmp_path}/packed/variants " in j for j in finished)
    done, calls = _queue(tmp_path, "run", FIG4B=_fig4b(sc, missing=True))
    assert done.stdout.count(": Fig. 4(b) has runs not finished, so no best cell yet") == len(best)


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_run_with_table_ids_runs_only_those_jobs_in_queue_order(tmp_path: Path) -> None:
    """``run fig4a 5``: a second worker's share of the queue, the jobs whose table ID (first word) is
    given, in QUEUE's order whatever the order given; an ID no job has (``fig4`` is not ``fig4a``; one
    word with a space is no ID) is said in one line, and a @BEST@ job of a table not given looks up no
    best cell."""
    head, tail = "-m bayesncl reproduce --seeds 3 ", f" --store {tmp_path}/store/variants"
    done, calls = _queue(tmp_path, "run", "5", "fig4a", "fig4", "5 fig4b")
    assert done.returncode == 0, done.stderr
    tables = [c.split(" | ")[0].removeprefix(head).removesuffix(tail) for c in calls]
    want = [j for j in _queue_jobs() if j.split()[0] in ("fig4a", "5")]
    assert [j.split()[0] for j in want] == ["fig4a", "5"]
    assert tables == [f"{j}{tail} --list-weightless" if k % 2 == 0 else j for j in want for k in (0, 1)]
    assert "skipped" not in done.stdout
    assert done.stdout.splitlines()[:2] == ["run: no job of the queue is table fig4: nothing run for it",
                                            "run: no job of the queue is table 5 fig4b: nothing run for it"]


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_again_sets_aside_the_runs_given_and_names_those_not_in_the_store(tmp_path: Path) -> None:
    """``long_queue.sh again HASH...`` (by hand): each stored run given into no-weights/ (replacing one
    set aside before), one line for each; a hash not in the store, or not a run's name, said in one line
    (it was passed over silently)."""
    store = tmp_path / "store"
    _run(store, "aaaaaaaaaaaa", weights=True)
    (store / "no-weights" / "aaaaaaaaaaaa").mkdir(parents=True)
    (store / "no-weights" / "aaaaaaaaaaaa" / "old").write_text("")
    done, calls = _queue(tmp_path, "again", "aaaaaaaaaaaa", "bbbbbbbbbbbb", "../variants")
    assert (done.returncode, done.stderr, calls) == (0, "", [])
    assert done.stdout.splitlines() == [
        f"again: set aaaaaaaaaaaa aside in {store}/no-weights/: the next table that reads it trains it again",
        f"again: no run bbbbbbbbbbbb in {store}/variants/: nothing set aside",
        "again: ../variants is not the name of a run in the store: nothing set aside",
    ]
    assert sorted(p.name for p in (store / "no-weights" / "aaaaaaaaaaaa").iterdir()) == [
        "config.yaml", "last.pt", "metrics.json", "reproduce.json"]  # fmt: skip
    assert list((store / "variants").iterdir()) == []
    done, _ = _queue(tmp_path, "bogus")
    assert done.returncode == 2 and done.stderr == (
        "usage: bash benchmarks/long_queue.sh [run [ID...]|pack|restore|again HASH...]\n"
    )


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_again_without_a_hash_is_a_usage_error(tmp_path: Path) -> None:
    """``long_queue.sh again`` with no hash set nothing aside and said nothing (exit 0), as if it had
    done its work; it is refused in one line on stderr, exit 2."""
    _run(tmp_path / "store", "aaaaaaaaaaaa")
    done, calls = _queue(tmp_path, "again")
    assert (done.returncode, done.stdout, calls) == (2, "", [])
    assert done.stderr == (
        "usage: bash benchmarks/long_queue.sh again HASH... (the stored runs to set aside)\n"
    )
    assert (tmp_path / "store" / "variants" / "aaaaaaaaaaaa").is_dir()


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_relative_store_is_where_the_script_was_started(tmp_path: Path) -> None:
    """``STORE=store bash benchmarks/long_queue.sh again HASH`` from a folder holding ``store/``: the
    script changes to the repository first, so a relative $STORE was read there (no run found, or another
    store's run moved); it is the caller's, as a relative path on a command line is."""
    _run(tmp_path / "store", "aaaaaaaaaaaa")
    env = {**os.environ, "STORE": "store", "PYTHON": "false"}
    done = subprocess.run(["bash", str(QUEUE_SH), "again", "aaaaaaaaaaaa"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (f"again: set aaaaaaaaaaaa aside in {tmp_path}/store/no-weights/: the next table "
                           "that reads it trains it again\n")  # fmt: skip
    assert (tmp_path / "store" / "no-weights" / "aaaaaaaaaaaa" / "metrics.json").exists()
    assert not (QUEUE_SH.parents[1] / "store").exists()
