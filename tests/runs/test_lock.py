"""The lock files of runs/lock.py: a claim, the probe that reads who holds one, and their meeting."""

from __future__ import annotations

import fcntl
import os
import pickle
import threading
from pathlib import Path

import pytest

from bayesncl.runs.lock import lock_file, lock_holder
from bayesncl.runs.messages import RunDirBusy


def test_a_claim_names_its_holder_to_the_probe_and_refuses_a_second_until_released(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    assert lock_holder(path) is None  # no file: nobody, and the probe creates none
    assert not path.exists()
    claim = lock_file(path, "busy: pid {pid}")
    assert claim is not None
    assert path.read_text() == f"{os.getpid()}\n" and lock_holder(path) == str(os.getpid())
    with pytest.raises(RunDirBusy) as e:  # another open file description: flock refuses this process too
        lock_file(path, "busy: pid {pid}")
    assert str(e.value) == f"busy: pid {os.getpid()}" and e.value.pid == str(os.getpid())
    again = pickle.loads(pickle.dumps(e.value))  # as run_on_main hands it to every rank
    assert (type(again), str(again), again.pid) == (RunDirBusy, str(e.value), e.value.pid)
    claim.release()
    assert not path.exists() and lock_holder(path) is None


def test_a_stale_file_of_a_killed_holder_is_claimed_and_a_probe_of_a_moment_is_waited_for(
    tmp_path: Path,
) -> None:
    """A file left by a SIGKILLed holder (its pid, no lock) is nobody's; a probe's shared lock (another
    process's --plan) held for 30 ms delays a claim, it does not refuse it."""
    path = tmp_path / "x.lock"
    path.write_text("99999\n")
    assert lock_holder(path) is None
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    threading.Timer(0.03, os.close, (fd,)).start()
    claim = lock_file(path, "{pid}")
    assert claim is not None and path.read_text() == f"{os.getpid()}\n"
    claim.release()
