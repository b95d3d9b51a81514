"""Atomic writes (bayesncl.runs.fileio): whole files only, ordinary modes, no temporaries left."""

from __future__ import annotations

import errno
import os
import pickle
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from bayesncl.runs.features import save_features
from bayesncl.runs.fileio import DiskFullError, atomic_path, remove_stale_temporaries, temporary_name


@pytest.fixture
def umask_027() -> Iterator[None]:
    old = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_atomic_path_replaces_with_the_umask_mode(tmp_path: Path, umask_027: None) -> None:
    dest = tmp_path / "a.txt"
    dest.write_text("old")
    with atomic_path(dest) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".a.txt.tmp")
        tmp.write_text("new")
        os.chmod(tmp, 0o600)  # as tempfile.mkstemp and safetensors create it
        assert dest.read_text() == "old"  # untouched until the block ends
    assert dest.read_text() == "new"
    assert _mode(dest) == 0o640  # 0o666 & ~0o027
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_atomic_path_keeps_the_old_file_on_error(tmp_path: Path) -> None:
    dest = tmp_path / "a.txt"
    dest.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(dest) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert dest.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_remove_stale_temporaries_removes_only_ours(tmp_path: Path) -> None:
    ours = [tmp_path / ".last.pt.tmp123", temporary_name(tmp_path / "log.csv")]
    theirs = [tmp_path / ".hidden", tmp_path / "notes.tmp1", tmp_path / ".x.tmp"]
    for p in ours + theirs:
        p.write_text("x")
    assert sorted(remove_stale_temporaries(tmp_path)) == sorted(ours)
    assert sorted(tmp_path.iterdir()) == sorted(theirs)


def test_features_and_exports_get_ordinary_modes(tmp_path: Path, umask_027: None) -> None:
    from safetensors.torch import save_file

    path = save_features(tmp_path / "f.npz", features=torch.rand(4, 3), labels=torch.arange(4))
    assert _mode(path) == 0o640
    with atomic_path(tmp_path / "e.safetensors") as tmp:
        save_file({"w": torch.zeros(2)}, str(tmp))
    assert _mode(tmp_path / "e.safetensors") == 0o640
    assert np.load(path)["features"].shape == (4, 3)


def test_disk_full_error_survives_pickling() -> None:
    """Under torchrun rank 0 hands an error to the other ranks pickled (distributed.run_on_main): a
    DiskFullError writing config.yaml failed to unpickle there (TypeError: OSError passes 2 args)."""
    e = pickle.loads(pickle.dumps(DiskFullError("x cannot be written: no space left")))
    assert type(e) is DiskFullError
    assert (str(e), e.errno) == ("x cannot be written: no space left", errno.ENOSPC)
