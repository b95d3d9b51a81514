"""The bad-input audit: every row of docs/bad-inputs.md, with the exact message it gets.

The messages are read from that table (``ROWS`` and ``expect``, in conftest.py; ``<tmp>`` stands for
the test's tmp dir, ``…`` for a part that varies, such as a loss value): a message lives in the code
and in the table only.
``test_every_row_of_the_docs_table_is_tested`` checks that every row names a test that exists.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torchvision

from bayesncl.app.cli import main
from bayesncl.app.train import pretrain
from bayesncl.config import build_config, load_yaml
from bayesncl.data import build_train_loader
from bayesncl.runs.safe_load import load_checkpoint_file

from ..conftest import (
    ERROR,
    ROWS,
    TESTS,
    TINY,
    TINY_BASE,
    doc_rows,
    expect,
    image_folder,
    start_cli,
    tiny_checkpoint,
    wait_for,
    write_fmnist,
)

E = ERROR  # the start of every error line

FOLDER = ["data.name=imagefolder", "data.train_subset=0", "data.test_subset=0"]

DAMAGED = "(damaged or edited): use another copy, or an earlier checkpoint of the run (epoch-NNNN.pt)"


def cli_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(args) == 2
    return capsys.readouterr().err


# ----------------------------------------------------------------------------- data
def test_missing_data_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["data.name=fashion-mnist", f"data.root={tmp_path}/nowhere"]
    expect("D1", cli_error(["pretrain", "--run-dir", str(tmp_path / "r"), *TINY, *args], capsys), tmp_path)


def test_empty_data_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    args = [*FOLDER, f"data.root={tmp_path}/empty"]
    expect("D2", cli_error(["pretrain", "--run-dir", str(tmp_path / "r"), *TINY, *args], capsys), tmp_path)


def test_empty_train_split(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "folder" / "train").mkdir(parents=True)
    args = [*FOLDER, f"data.root={tmp_path}/folder"]
    expect("D3", cli_error(["pretrain", "--run-dir", str(tmp_path / "r"), *TINY, *args], capsys), tmp_path)


def test_corrupt_image_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    image_folder(tmp_path / "folder")
    (tmp_path / "folder/train/cat/broken.png").write_bytes(b"not an image at all")
    args = [*FOLDER, f"data.root={tmp_path}/folder"]
    expect("D4", cli_error(["pretrain", "--run-dir", str(tmp_path / "r"), *TINY, *args], capsys), tmp_path)
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_corrupt_image_found_when_read_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder above VERIFY_MAX_FILES images is checked as it is read: with data.num_workers > 0 the
    error came back from the DataLoader worker as 'Caught DataError in DataLoader worker process 0.'
    and the worker's whole traceback. Under torchrun only the process whose shard holds the image
    meets it: that process prints it, naming its rank (a rank > 0 kept quiet, and nothing was said)."""
    import bayesncl.app.cli as cli_module
    import bayesncl.data.folders as folders
    import bayesncl.data.sources as ds

    monkeypatch.setattr(folders, "VERIFY_MAX_FILES", 0)
    image_folder(tmp_path / "folder")
    (tmp_path / "folder/train/cat/broken.png").write_bytes(b"not an image at all")
    args = [*FOLDER, f"data.root={tmp_path}/folder", "data.resident=false", "data.num_workers=1"]
    expect("E1", cli_error(["pretrain", "--run-dir", str(tmp_path / "r"), *TINY, *args], capsys), tmp_path)
    assert not (tmp_path / "r").exists()

    # the error is the shard's own (ShardDataError), read by a worker or not
    cfg = build_config(overrides=[*TINY, *args])
    for workers in (0, 1):
        loader = build_train_loader(
            dataclasses.replace(cfg.data, num_workers=workers), 8, seed=0, device=torch.device("cpu")
        )
        with pytest.raises(ds.ShardDataError) as info:
            for _ in loader:
                pass
        assert str(info.value).startswith(f"corrupt image {tmp_path}/folder/train/cat/broken.png (")

    # rank 1 of a node prints it, naming itself, at once
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    slept: list[float] = []
    monkeypatch.setattr("time.sleep", slept.append)  # (the error layer waits with time.sleep)

    def shard_error(args: Any) -> None:
        raise ds.ShardDataError(str(info.value))

    monkeypatch.setattr(cli_module, "cmd_pretrain", shard_error)
    assert main(["pretrain"]) == 2
    assert capsys.readouterr().err == E + "(rank 1) " + str(info.value) + "\n"
    assert slept == []


@pytest.mark.slow
def test_resume_of_a_run_dir_with_a_log_but_no_last_pt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run killed while writing its last.pt in epoch 1 (log.csv is written just before it), or
    whose last.pt was deleted: without --resume the run dir "already holds a run; pass --resume",
    and --resume said "the run stopped before its first checkpoint: run the same command without
    --resume", each sending the user to the other."""
    run = tmp_path / "run"
    args = ["pretrain", "--run-dir", str(run), *TINY, "train.checkpoint_every=1", "--no-eval"]
    assert main(args) == 0
    (run / "last.pt").unlink()
    assert "already holds a run; pass --resume" in cli_error(args, capsys)
    expect("E2", cli_error([*args, "--resume"], capsys), tmp_path)
    (run / "epoch-0001.pt").unlink()
    assert cli_error([*args, "--resume"], capsys) == (
        f"{E}--resume: no checkpoint {run}/last.pt to resume from ({run} holds log.csv but no last.pt, "
        "killed while saving it or deleted: pass --overwrite instead of --resume to start the run again)\n"
    )
    assert main([*args, "--overwrite"]) == 0 and (run / "last.pt").exists()


@pytest.mark.slow
def test_skip_corrupt_skips_and_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    image_folder(tmp_path / "folder")
    (tmp_path / "folder/train/cat/broken.png").write_bytes(b"not an image at all")
    args = [*FOLDER, f"data.root={tmp_path}/folder", "--skip-corrupt", "--no-eval"]
    assert main(["pretrain", "--run-dir", str(tmp_path / "r"), *TINY, *args]) == 0
    (message,) = [m for m in caplog.messages if "corrupt" in m]
    expect("D5", message, tmp_path)
    assert (tmp_path / "r" / "last.pt").exists()
    assert build_config(overrides=[*TINY, "data.skip_corrupt=true"]).data.skip_corrupt


def test_batch_larger_than_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pretrain", "--run-dir", str(tmp_path / "r"), *TINY, "train.batch_size=500"]) == 2
    out, err = capsys.readouterr()
    expect("D6", err, tmp_path)
    assert out == "" and not (tmp_path / "r").exists()  # refused before "run dir: ..." is printed


@pytest.mark.slow
def test_a_subset_of_one_image_per_class(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It trained, then the end-of-training probe failed with "too few train samples per class to hold
    out a validation split", naming no setting; now refused before anything is written."""
    run = tmp_path / "r"
    args = ["pretrain", "--run-dir", str(run), *TINY, "data.train_subset=2", "train.batch_size=2"]
    expect("F1", cli_error(args, capsys), tmp_path)
    assert not run.exists()
    # --no-eval trains it; evaluate's probe then says why it cannot choose its L2 strength
    assert main([*args, "--no-eval"]) == 0
    err = cli_error(["evaluate", str(run), "--no-knn"], capsys)
    assert err == E + (
        "too few train samples per class to hold out a validation split: 2 samples in 2 classes, at most "
        "one per class; the L2 strength is chosen on held-out samples of classes with >= 2\n"
    )
    assert not (run / "evaluation.json").exists()


def test_single_class_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "one.npz", features=np.abs(rng.normal(size=(50, 8))).astype(np.float32),
             labels=np.zeros(50, dtype=np.int64))
    assert main(["metrics", str(tmp_path / "one.npz"), "--json"]) == 0
    out = capsys.readouterr()
    assert out.err == "" and '"semantic_consistency": 100.0' in out.out
    assert '"semantic_entropy_sum": 0.0' in out.out
    assert ROWS["D7"].startswith("(no error, exit 0")


def test_single_class_pretrain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    image_folder(tmp_path / "folder", classes=("only",), n=40)
    args = [*FOLDER, f"data.root={tmp_path}/folder"]
    expect("D8", cli_error(["pretrain", "--run-dir", str(tmp_path / "r"), *TINY, *args], capsys), tmp_path)
    assert not (tmp_path / "r").exists()  # refused before anything is written


def test_nan_features(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = np.random.default_rng(0).normal(size=(50, 8)).astype(np.float32)
    f[3, 2] = np.nan
    np.savez(tmp_path / "nan.npz", features=f, labels=np.arange(50) % 3)
    expect("D9", cli_error(["metrics", str(tmp_path / "nan.npz")], capsys), tmp_path)


def test_damaged_features_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A features file damaged inside its zip (bad CRC, cut-short .npy, a member that is no .npy)
    is one line naming the array and the reason: not a traceback, not "holds Python objects"."""
    import io
    import zipfile

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "crc.npz", features=rng.random((50, 8)).astype(np.float32), labels=np.arange(50) % 3)
    data = bytearray((tmp_path / "crc.npz").read_bytes())
    data[data.find(b"NUMPY") + 200] ^= 0xFF  # one byte inside the features array: its CRC-32 no longer fits
    (tmp_path / "crc.npz").write_bytes(bytes(data))
    expect("A1", cli_error(["metrics", str(tmp_path / "crc.npz")], capsys), tmp_path)

    def npy(a: np.ndarray) -> bytes:
        buf = io.BytesIO()
        np.save(buf, a)
        return buf.getvalue()

    with zipfile.ZipFile(tmp_path / "short.npz", "w") as z:
        z.writestr("features.npy", npy(np.zeros((4, 2), np.float32))[:-8])
        z.writestr("labels.npy", npy(np.zeros(4, np.int64)))
    expect("A2", cli_error(["metrics", str(tmp_path / "short.npz")], capsys), tmp_path)
    with zipfile.ZipFile(tmp_path / "raw.npz", "w") as z:
        z.writestr("features.npy", b"notnpy")
        z.writestr("labels.npy", npy(np.zeros(4, np.int64)))
    expect("A3", cli_error(["metrics", str(tmp_path / "raw.npz")], capsys), tmp_path)
    np.savez_compressed(tmp_path / "zlib.npz", features=rng.random((50, 8)), labels=np.arange(50) % 3)
    data = bytearray((tmp_path / "zlib.npz").read_bytes())
    for i in range(60, 120):  # inside the first member's deflate stream
        data[i] ^= 0x55
    (tmp_path / "zlib.npz").write_bytes(bytes(data))
    err = cli_error(["metrics", str(tmp_path / "zlib.npz")], capsys)
    damaged = "array 'features' cannot be read, the archive is damaged: "
    assert err.startswith(E + f"{tmp_path}/zlib.npz: {damaged}")
    assert err.count("\n") == 1


def test_extract_out_is_a_npz_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``extract --out`` naming a run's own checkpoint (or any non-.npz file) is refused before
    anything is written: it used to replace last.pt with a features file, killing --resume."""
    (tmp_path / "run").mkdir()
    run = tiny_checkpoint(tmp_path / "run" / "last.pt", [])
    before = run.read_bytes()
    expect("B10", cli_error(["extract", str(tmp_path / "run"), "--out", str(run)], capsys), tmp_path)
    assert run.read_bytes() == before
    (tmp_path / "run" / "config.yaml").write_text("seed: 0\n")
    err = cli_error(["extract", str(run), "--out", str(tmp_path / "run" / "config.yaml")], capsys)
    assert err == E + f"--out {tmp_path}/run/config.yaml: expected a .npz file path (a features file)\n"
    assert (tmp_path / "run" / "config.yaml").read_text() == "seed: 0\n"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["config.yaml", "last.pt"]


def test_sizes_that_do_not_fit_in_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A projector of 10^12 dims cannot be allocated: one line naming the size and the keys to
    lower (it was a DefaultCPUAllocator traceback), and no run dir is left behind."""
    args = ["pretrain", "--run-dir", str(tmp_path / "r"), *TINY, "model.proj_dim=1000000000000"]
    err = cli_error(args, capsys)
    expect("B7", err, tmp_path)
    assert "(tried to allocate 119,209.3 GiB)" in err
    assert not (tmp_path / "r").exists()


def test_out_of_memory_errors_are_recognised() -> None:
    from bayesncl.app.errors import out_of_memory

    with pytest.raises(MemoryError) as numpy_error:
        np.empty((10**7, 10**7))
    assert out_of_memory(numpy_error.value, "metrics") == (
        "out of memory in main memory (tried to allocate 728. TiB): lower the number of features "
        "(or --retrieval-dims)"
    )
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")
    assert out_of_memory(cuda, "evaluate") == (
        "out of memory on the GPU (tried to allocate 2.00 GiB): lower eval.batch_size (or data.image_size)"
    )
    assert out_of_memory(RuntimeError("shape mismatch"), None) is None
    assert out_of_memory(ValueError("can't allocate memory"), None) is None


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    ("row", "args"),
    [("C1", ["method.bogus=1"]), ("C2", ["method.rho=1.5"]), ("C3", ["train.epochs=0"]),
     ("C4", ["train.epochs=abc"]), ("C9", ["data.image_size=1"]), ("C10", ["method.temperature=1e-30"]),
     ("B1", ["seed=100000000000000000000"]), ("A6", ["train.epochs=1000000"])],
)
def test_bad_config_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], row: str, args: list[str]
) -> None:
    expect(row, cli_error(["pretrain", "--run-dir", str(tmp_path / "r"), *TINY, *args], capsys), tmp_path)
    assert not (tmp_path / "r").exists()


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = cli_error(["pretrain", "--config", str(tmp_path / "missing.yaml"), *TINY], capsys)
    expect("C5", err, tmp_path)


def test_unreadable_config_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bin.yaml").write_bytes(b"\x89PNG\r\n\x1a\n")
    (tmp_path / "bad.yaml").write_text("method: 3\n")
    run = ["--run-dir", str(tmp_path / "r")]
    expect("C6", cli_error(["pretrain", *run, "--config", str(tmp_path / "bin.yaml")], capsys), tmp_path)
    expect("C7", cli_error(["pretrain", *run, "--config", str(tmp_path)], capsys), tmp_path)
    expect("C8", cli_error(["pretrain", *run, "--config", str(tmp_path / "bad.yaml")], capsys), tmp_path)
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_final_learning_rate_above_the_peak(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """train.min_lr above base_lr x batch / 256 trained with a rate that rose over the run (the
    cosine from the peak to min_lr), logged as lr=7.5 after epoch 1 of a run peaking at 0.05."""
    run = tmp_path / "r"
    expect("F3", cli_error(["pretrain", "--run-dir", str(run), *TINY, "train.min_lr=0.1"], capsys), tmp_path)
    assert not run.exists()
    assert main(["pretrain", "--run-dir", str(run), *TINY, "train.min_lr=0.05", "--no-eval"]) == 0  # = peak


@pytest.mark.slow
def test_paper_probe_on_fewer_images_than_a_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It said "batch_size=256 is larger than the 96 training samples of synthetic: lower
    train.batch_size", a setting that evaluate cannot change and the paper probe does not use."""
    ckpt = tiny_checkpoint(tmp_path / "run.pt", [])
    err = cli_error(["evaluate", str(ckpt), "--probe", "paper", "--probe-epochs", "1", "--no-knn"], capsys)
    expect("F4", err, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.pt"]


def test_a_key_given_twice_in_a_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """PyYAML keeps the last of two equal keys: the second ``method:`` section silently dropped the
    first one's rho (the run trained with rho=0.8, the default)."""
    (tmp_path / "dup.yaml").write_text("method:\n  rho: 0.5\nmethod:\n  lam: 0.01\n")
    args = ["pretrain", "--run-dir", str(tmp_path / "r"), *TINY, "--config", str(tmp_path / "dup.yaml")]
    expect("F2", cli_error(args, capsys), tmp_path)
    assert not (tmp_path / "r").exists()
    (tmp_path / "dup.yaml").write_text("method: {rho: 0.5, lam: 0.01, rho: 0.6}\n")
    assert cli_error(args, capsys) == E + (
        f"config file '{tmp_path}/dup.yaml' is not valid YAML at line 1, column 31: duplicate key 'rho' "
        "(first at line 1)\n"
    )
    assert not (tmp_path / "r").exists()
    # one key per mapping, and a merged anchor's key overridden: as before
    (tmp_path / "ok.yaml").write_text("_m: &m {rho: 0.5, lam: 0.1}\nmethod: {<<: *m, rho: 0.6}\n")
    assert load_yaml(tmp_path / "ok.yaml") == {
        "_m.rho": 0.5, "_m.lam": 0.1, "method.rho": 0.6, "method.lam": 0.1
    }


def test_a_single_value_for_a_list_key_in_a_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`retrieval_dims: 64` (or `32,64`, a string) in a YAML file was taken as [64] without a word; a
    file writes a list as one. The command line keeps its short form (tests/test_config.py)."""
    (tmp_path / "dims.yaml").write_text("eval:\n  retrieval_dims: 64\n")
    (tmp_path / "text.yaml").write_text("eval:\n  retrieval_dims: 32,64\n")
    run = ["--run-dir", str(tmp_path / "r"), *TINY, "--no-eval"]
    expect("G2", cli_error(["pretrain", *run, "--config", str(tmp_path / "dims.yaml")], capsys), tmp_path)
    assert cli_error(["pretrain", *run, "--config", str(tmp_path / "text.yaml")], capsys) == E + (
        f"config file '{tmp_path / 'text.yaml'}': eval.retrieval_dims='32,64': expected a list, e.g. "
        "retrieval_dims: [32, 64]\n"
    )
    assert not (tmp_path / "r").exists()


def test_benchmark_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    expect("C11", cli_error(["benchmark", "method.name=cl"], capsys), tmp_path)
    expect("C12", cli_error(["benchmark", "--device", "tpu"], capsys), tmp_path)
    expect("C13", cli_error(["benchmark", "--threads", "-3"], capsys), tmp_path)
    err = cli_error(["benchmark", "--threads", "100000"], capsys)  # torch crashed with SIGSEGV on it
    expect("B8", err, tmp_path)
    assert f" to {os.cpu_count()} (the CPUs here)" in err


def test_demo_method_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = cli_error(["demo", "--run-dir", str(tmp_path / "demo"), "method.name=cl"], capsys)
    expect("C14", err, tmp_path)
    assert not (tmp_path / "demo").exists()


def test_unknown_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["pretrain", "--bogus-flag"])
    assert e.value.code == 2
    expect("C15", capsys.readouterr().err, tmp_path)


# ----------------------------------------------------------------------------- run dir
def test_unwritable_run_dir_under_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a-file").write_text("x")
    expect("R1", cli_error(["pretrain", "--run-dir", str(tmp_path / "a-file/run"), *TINY], capsys), tmp_path)
    expect("R2", cli_error(["pretrain", "--run-dir", str(tmp_path / "a-file"), *TINY], capsys), tmp_path)
    assert (tmp_path / "a-file").read_text() == "x"


@pytest.mark.slow
def test_reproduce_run_dir_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`reproduce --run-dir FILE` printed its first variant's "== CL: pretraining into FILE/cl" line
    before the error; every table now checks the run dir, and each variant's folder, before any output."""

    def refused(run_dir: Path, table: str) -> str:
        capsys.readouterr()
        assert main(["reproduce", table, "--dataset", "fashion-mnist", "--run-dir", str(run_dir)]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        return err

    (tmp_path / "a-file").write_text("x")
    for table in ("1", "2", "4", "7"):
        expect("G1", refused(tmp_path / "a-file", table), tmp_path)
    (tmp_path / "variants").write_text("x")  # the store of runs (default: beside the run dir) is a file
    store = tmp_path / "variants"
    expected = f"bayesncl: error: store {store} is a file, not a directory; choose another --store"
    assert refused(tmp_path / "t7", "7") == expected + "\n"
    assert (tmp_path / "a-file").read_text() == "x" and not (tmp_path / "t7").exists()


def test_read_only_run_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ro = tmp_path / "read-only"
    ro.mkdir()
    if os.geteuid() == 0:  # root passes permission bits: simulate what a normal user's check sees
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == ro else real(p, mode))
    ro.chmod(0o555)
    try:
        expect("R3", cli_error(["pretrain", "--run-dir", str(ro / "run"), *TINY], capsys), tmp_path)
    finally:
        ro.chmod(0o755)
    assert list(ro.iterdir()) == []


@pytest.mark.slow
def test_run_dir_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = str(tmp_path / "run")
    expect("R5", cli_error(["pretrain", "--run-dir", run, "--resume", *TINY], capsys), tmp_path)
    expect("R7", cli_error(["pretrain", "--resume", *TINY], capsys), tmp_path)
    assert main(["pretrain", "--run-dir", run, *TINY, "--no-eval"]) == 0
    expect("R4", cli_error(["pretrain", "--run-dir", run, *TINY], capsys), tmp_path)
    changed = ["method.rho=0.5", "train.batch_size=16"]
    expect("R6", cli_error(["pretrain", "--run-dir", run, "--resume", *TINY, *changed], capsys), tmp_path)


def test_empty_run_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # where the default runs/ would be created
    for command in (["pretrain", *TINY], ["demo", *TINY], ["reproduce", "7", "--dataset", "fashion-mnist"]):
        expect("R8", cli_error([*command, "--run-dir", ""], capsys), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_demo_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "notes.txt").write_text("mine")
    expect("R9", cli_error(["demo", "--run-dir", str(demo), *TINY], capsys), tmp_path)
    expect("R10", cli_error(["demo", "--run-dir", str(demo), "--resume", *TINY], capsys), tmp_path)
    assert [p.name for p in demo.iterdir()] == ["notes.txt"]


# ----------------------------------------------------------------------------- checkpoints
def test_not_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.pt").write_text("hello world\n")
    (tmp_path / "empty.pt").write_bytes(b"")
    expect("K1", cli_error(["extract", str(tmp_path / "notes.pt")], capsys), tmp_path)
    expect("K2", cli_error(["evaluate", str(tmp_path / "empty.pt")], capsys), tmp_path)
    expect("K8", cli_error(["extract", str(tmp_path)], capsys), tmp_path)
    expect("K9", cli_error(["evaluate", str(tmp_path / "nowhere")], capsys), tmp_path)


def test_malformed_bayesncl_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Files with bayesncl's format marker whose content is missing or edited: each used to end in a
    KeyError, TypeError or JSONDecodeError traceback."""
    from safetensors.torch import save_file

    good = torch.load(tiny_checkpoint(tmp_path / "good.pt", []), weights_only=True)
    torch.save({k: v for k, v in good.items() if k != "config"}, tmp_path / "no-config.pt")
    expect("B3", cli_error(["evaluate", str(tmp_path / "no-config.pt")], capsys), tmp_path)
    newer = {**good, "config": {**good["config"], "method": {**good["config"]["method"], "new_key": 1}}}
    torch.save(newer, tmp_path / "newer.pt")  # e.g. from a later bayesncl with a new setting
    expect("B4", cli_error(["extract", str(tmp_path / "newer.pt")], capsys), tmp_path)
    for name, entry, kind in (("sd.pt", "state_dict", None), ("cfg.pt", "config", "hello")):
        torch.save({**good, entry: kind}, tmp_path / name)
        err = cli_error(["evaluate", str(tmp_path / name)], capsys).strip()
        assert err == E + (
            f"{tmp_path / name}: its '{entry}' entry is a {type(kind).__name__}, expected a mapping {DAMAGED}"
        )
    torch.save({**good, "state_dict": {**good["state_dict"], "x": 3}}, tmp_path / "int.pt")
    err = cli_error(["evaluate", str(tmp_path / "int.pt")], capsys).strip()
    want = f"{tmp_path / 'int.pt'}: its 'state_dict' entry 'x' is an int, expected a tensor {DAMAGED}"
    assert err == E + want
    tensors = {k: v.contiguous() for k, v in good["state_dict"].items()}
    save_file(tensors, tmp_path / "enc.safetensors", metadata={"format": "bayesncl-encoder-v1", "config": ""})
    expect("B5", cli_error(["evaluate", str(tmp_path / "enc.safetensors")], capsys), tmp_path)
    save_file(tensors, tmp_path / "list.safetensors", metadata={"config": "[1]"})
    err = cli_error(["evaluate", str(tmp_path / "list.safetensors")], capsys).strip()
    assert err == E + (
        f"{tmp_path / 'list.safetensors'}: the config in its metadata is a JSON list, expected an object of "
        "config sections: damaged or edited; export again"
    )


@pytest.mark.slow
def test_resume_of_a_damaged_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main(["pretrain", "--run-dir", str(run), *TINY, "--no-eval"]) == 0
    last = (run / "last.pt").read_bytes()
    (run / "config.yaml").write_text("")  # e.g. a disk that was full
    resume = ["pretrain", "--run-dir", str(run), "--resume", "train.epochs=2"]
    expect("B6", cli_error(resume, capsys), tmp_path)
    (run / "config.yaml").unlink()  # then last.pt's config is used; it lacks the optimiser state
    ckpt = torch.load(run / "last.pt", weights_only=True)
    torch.save({k: v for k, v in ckpt.items() if k != "optimizer"}, run / "last.pt")
    err = cli_error(resume, capsys).strip()
    assert err == E + (
        f"--resume: {run / 'last.pt'} is a bayesncl-checkpoint-v1 checkpoint without its 'optimizer' entry "
        f"{DAMAGED}"
    )
    log = (run / "log.csv").read_bytes()
    torch.save({**ckpt, "precision": "bf16"}, run / "last.pt")  # it used to end in a TypeError traceback
    expect("B12", cli_error(resume, capsys), tmp_path)
    for bad, shown in (
        ({"dtype": "bf16"}, "{'dtype': 'bf16'}"),  # a KeyError traceback
        ({"channels_last": False, "dtype": "fp8"}, "{'channels_last': False, 'dtype': 'fp8'}"),
        ({"channels_last": 1, "dtype": "fp32"}, "{'channels_last': 1, 'dtype': 'fp32'}"),
    ):
        torch.save({**ckpt, "precision": bad}, run / "last.pt")
        assert cli_error(resume, capsys).strip() == E + (
            f"--resume: {run / 'last.pt'}: its 'precision' entry is {shown}, expected a mapping of 'dtype' "
            f"(fp32, bf16 or fp16) and 'channels_last' (true or false) {DAMAGED}"
        )
    assert (run / "log.csv").read_bytes() == log
    (run / "last.pt").write_bytes(last)  # nothing was changed by the refused commands
    assert sorted(p.name for p in run.iterdir()) == [
        "encoder.safetensors", "epoch-0001.pt", "last.pt", "log.csv", "training_curves.png"
    ]


def test_dynamics_of_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "last.pt").write_bytes(b"PK")
    expect("K12", cli_error(["dynamics", str(tmp_path / "run" / "last.pt")], capsys), tmp_path)


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204 - pickle protocol
        return (os.system, (f"touch {self.marker}",))


def test_crafted_pickle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "MARKER"
    torch.save({"format": "bayesncl-checkpoint-v1", "config": _RunsCode(marker)}, tmp_path / "evil.pt")
    expect("K3", cli_error(["extract", str(tmp_path / "evil.pt")], capsys), tmp_path)
    assert not marker.exists()


@pytest.mark.slow
def test_checkpoint_of_another_architecture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(torchvision.models.resnet18().state_dict(), tmp_path / "resnet18.pt")
    expect("K4", cli_error(["extract", str(tmp_path / "resnet18.pt")], capsys), tmp_path)

    net = torchvision.models.resnet18()
    net.fc = torch.nn.Identity()
    proj = torch.nn.Sequential(
        torch.nn.Linear(512, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(), torch.nn.Linear(64, 32)
    )
    sd = {f"backbone.{k}": v for k, v in net.state_dict().items()}
    sd |= {f"projector.{k}": v for k, v in proj.state_dict().items()}
    torch.save({"state_dict": sd}, tmp_path / "bn.ckpt")
    expect("K5", cli_error(["extract", str(tmp_path / "bn.ckpt"), "data.name=synthetic"], capsys), tmp_path)

    pretrain(build_config(overrides=TINY), tmp_path / "run", evaluate=False)
    ckpt = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    ckpt["state_dict"]["projector.net.2.weight"] = torch.zeros(8, 32)
    torch.save(ckpt, tmp_path / "edited.pt")
    expect("K6", cli_error(["extract", str(tmp_path / "edited.pt")], capsys), tmp_path)

    sd = {f"backbone.{k}": v for k, v in net.state_dict().items()}
    sd |= {f"projector.{k}": v for k, v in torch.nn.Sequential(
        torch.nn.Linear(512, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)).state_dict().items()}
    sd |= {"classifier.weight": torch.zeros(10, 512), "classifier.bias": torch.zeros(10)}
    torch.save({"state_dict": sd}, tmp_path / "official.ckpt")
    expect("K7", cli_error(["evaluate", str(tmp_path / "official.ckpt")], capsys), tmp_path)


def test_data_override_with_other_channels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # trained on 1-channel fashion-mnist (its data need not be here), extracted on 3-channel synthetic
    fm = tiny_checkpoint(tmp_path / "fm.pt", ["data.name=fashion-mnist", f"data.root={tmp_path}/gone"], 1)
    expect("K10", cli_error(["extract", str(fm), "data.name=synthetic"], capsys), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fm.pt"]


def test_unwritable_features_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tiny_checkpoint(tmp_path / "run.pt", [], 3)
    (tmp_path / "notes.pt").write_text("hello world\n")
    err = cli_error(["extract", str(run), "--out", str(tmp_path / "notes.pt" / "x.npz")], capsys)
    expect("K11", err, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.pt", "run.pt"]
    assert (tmp_path / "notes.pt").read_text() == "hello world\n"


def test_curves_of_a_bad_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    expect("K13", cli_error(["curves", str(run)], capsys), tmp_path)
    header = "epoch,step,loss,info_nce,kl,gate_open,rho,rows_all_closed,online_acc,lr,epoch_time_s\n"
    (run / "log.csv").write_text(header + "1,3,5.5,5.4,0,1,,0,10,0.1,2\n2,6,5.4,nan?,0,1,,0,20,0.1,2\n")
    expect("K14", cli_error(["curves", str(run)], capsys), tmp_path)
    assert sorted(p.name for p in run.iterdir()) == ["log.csv"]


@pytest.mark.slow
def test_unwritable_curves_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.csv").write_text(
        "epoch,step,loss,info_nce,kl,gate_open,rho,rows_all_closed,online_acc,lr,epoch_time_s\n"
        "1,3,5.5,5.4,2.5,0.4,0.5,0,10,0.1,2\n"
    )
    (tmp_path / "notes.pt").write_text("hello world\n")
    err = cli_error(["curves", str(run), "--out", str(tmp_path / "notes.pt" / "c.png")], capsys)
    expect("K15", err, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.pt", "run"]
    assert sorted(p.name for p in run.iterdir()) == ["log.csv"]


def test_damaged_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One flipped byte inside a weight tensor: torch.load alone would read it as a wrong weight."""
    import zipfile

    run = tiny_checkpoint(tmp_path / "run.pt", [], 3)
    with zipfile.ZipFile(run) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    data = bytearray(run.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)  # local header
    data[start + info.file_size // 2] ^= 0xFF
    run.write_bytes(bytes(data))
    assert torch.load(run, weights_only=True)["state_dict"]  # still "loads"
    expect("K16", cli_error(["evaluate", str(run)], capsys), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.pt"]


@pytest.mark.integration
def test_two_commands_on_one_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A second command on a run dir another process is writing is refused, --overwrite included;
    the first run goes on and ends whole."""

    run = tmp_path / "run"
    args = ["pretrain", "--run-dir", str(run), *TINY, "data.train_subset=192", "train.epochs=2", "--no-eval"]
    first = start_cli(args, delay=0.5)  # 12 steps: 6 s
    wait_for(lambda: (run / "config.yaml").exists(), first)
    for extra in (["--overwrite"], ["--overwrite", "method.name=ncl"]):
        expect("R11", cli_error([*args, *extra], capsys), tmp_path)
    assert str(first.pid) in (run / ".bayesncl.lock").read_text()
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert load_checkpoint_file(run / "last.pt")["epoch"] == 2 and not (run / ".bayesncl.lock").exists()
    assert main([*args, "--overwrite"]) == 0  # free again


@pytest.mark.slow
def test_a_run_written_while_this_one_set_up_is_not_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run dir is checked before the data is loaded and the model built, and locked only after:
    another command that wrote a whole run in between (and ended, dropping its lock) used to be
    trained over without --overwrite. Now the check is repeated under the lock (R4)."""
    import bayesncl.runs.lock as lock_module

    run = tmp_path / "run"
    other = tmp_path / "other"
    assert main(["pretrain", "--run-dir", str(other), *TINY, "--no-eval"]) == 0
    real_lock = lock_module.lock_run_dir

    def the_other_command_finishes_first(run_dir: Path) -> Any:
        for p in other.iterdir():
            if p.is_file() and not p.name.startswith("."):
                (run_dir / p.name).write_bytes(p.read_bytes())
        return real_lock(run_dir)

    monkeypatch.setattr(lock_module, "lock_run_dir", the_other_command_finishes_first)
    before = {p.name: p.read_bytes() for p in other.iterdir() if p.is_file() and not p.name.startswith(".")}
    expect("R4", cli_error(["pretrain", "--run-dir", str(run), *TINY, "seed=7"], capsys), tmp_path)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # no lock file left either


# ----------------------------------------------------------------------------- M: command-line messages
@pytest.mark.skipif(not Path("/proc/self/mounts").is_file(), reason="needs Linux's /proc")
def test_run_dir_on_a_virtual_file_system(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:  # /proc is read-only to a normal user: simulate root, who passes os.access
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: True if Path(p) == Path("/proc") else real(p, mode))
    expect("M1", cli_error(["pretrain", "--run-dir", "/proc/x", *TINY], capsys), tmp_path)
    err = cli_error(["pretrain", "--run-dir", "/proc", *TINY], capsys)
    assert err == E + "run dir /proc is not writable: it does not accept new files (a virtual file system: " \
        "proc)\n"


def test_offline_download_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchvision's own download, offline: its error's first line ends in ':', the reason follows."""
    import urllib.error

    import torchvision.datasets.mnist

    def offline(url: str, **kwargs: object) -> None:
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(torchvision.datasets.mnist, "download_and_extract_archive", offline)
    args = ["data.name=fashion-mnist", f"data.root={tmp_path}/fm", "data.download=true"]
    expect("M2", cli_error(["pretrain", "--run-dir", str(tmp_path / "r"), *TINY, *args], capsys), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_evaluate_names_itself_in_the_channel_advice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    write_fmnist(tmp_path / "fm")  # 1-channel images
    syn = tiny_checkpoint(tmp_path / "syn.pt", [], 3)  # trained on 3-channel synthetic images
    # the whole (tiny) split: the checkpoint's subsets are larger, which warns once per process
    args = ["data.name=fashion-mnist", f"data.root={tmp_path}/fm"]
    args += ["data.train_subset=0", "data.test_subset=0"]
    expect("M3", cli_error(["evaluate", str(syn), *args], capsys), tmp_path)
    err = cli_error(["extract", str(syn), *args], capsys)  # extract: K10's advice
    assert err.strip().endswith(": extract with a dataset of 3-channel images"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fm", "syn.pt"]


@pytest.mark.slow
def test_probe_options_the_probe_does_not_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = str(tiny_checkpoint(tmp_path / "run.pt", [], 3))
    expect("M4", cli_error(["evaluate", run, "--probe", "none", "--probe-seeds", "3"], capsys), tmp_path)
    expect("M5", cli_error(["evaluate", run, "--probe", "fast", "--probe-epochs", "10"], capsys), tmp_path)
    # the probe set by eval.probe (an override, or the run's own): named as such
    err = cli_error(["evaluate", run, "eval.probe=none", "--probe-seeds", "1"], capsys)
    assert err == E + "--probe-seeds 1 has no effect with eval.probe=none: it sets the linear probe's " \
        "seeds (--probe fast or paper)\n"
    err = cli_error(["evaluate", run, "--probe-epochs", "50"], capsys)
    assert err == E + "--probe-epochs 50 has no effect with the run's eval.probe=fast: it sets the paper " \
        "probe's epochs (--probe paper)\n"
    assert cli_error(["evaluate", run, "--probe", "none", "--probe-epochs", "5"], capsys).startswith(
        E + "--probe-epochs 5 has no effect with --probe none:"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.pt"]
    # not given, the defaults (1 seed, 50 epochs) stay quiet
    assert main(["evaluate", run, "--probe", "none", "--no-knn"]) == 0
    assert main(["evaluate", run, "--probe-seeds", "2", "--no-knn"]) == 0
    assert json.loads((tmp_path / "evaluation.json").read_text())["linear_probe_seeds"] == [0, 1]
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_diverged_weights_with_a_finite_loss(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """lr 1e12: the loss stays finite (training BatchNorm uses the batch's statistics) but the running
    variance becomes inf, which made every evaluation feature constant: a run of garbage, exit 0."""
    run = tmp_path / "run"
    expect("B2", cli_error(["pretrain", "--run-dir", str(run), *TINY, "train.epochs=2",
                            "train.base_lr=1e12"], capsys), tmp_path)
    assert not run.exists()


def test_out_of_memory_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch or image too large for the device: a setting, not a bug (it was a traceback)."""
    run = tmp_path / "run"
    expect("B7", cli_error(["pretrain", "--run-dir", str(run), *TINY, "data.image_size=100000"], capsys),
           tmp_path)
    assert not run.exists()
    import bayesncl.core.engine as engine_module

    def cuda_oom(*args: object, **kwargs: object) -> None:
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of "
            "which 3.06 GiB is free. Including non-PyTorch memory, this process has 76.12 GiB memory in use."
        )

    monkeypatch.setattr(engine_module, "train_step", cuda_oom)
    err = cli_error(["pretrain", "--run-dir", str(run), *TINY], capsys)
    assert err == E + (
        "out of memory on the GPU (tried to allocate 20.00 GiB): lower train.batch_size, data.image_size or "
        "the model's size (model.backbone, model.proj_dim, model.proj_hidden, method.gate_hidden)\n"
    )
    assert not run.exists()
    err = cli_error(["benchmark", "--image-size", "100000", "--backbone", "small_cnn"], capsys)
    assert re.fullmatch(
        E + r"out of memory in main memory \(tried to allocate [\d,.]+ GiB\): lower --batch-size, "
        r"--image-size or --backbone", err.splitlines()[-1]
    ), err


@pytest.mark.slow
def test_a_full_disk_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.save on a full file system fails with 'RuntimeError: ... unexpected pos N vs M' (a
    traceback before); the epoch-1 run is removed whole, log.csv included (it named an epoch whose
    checkpoint was never written, and made the run dir refuse a plain rerun)."""
    from types import SimpleNamespace

    import bayesncl.runs.fileio as fileio

    run = tmp_path / "run"
    real_save = torch.save

    def save_on_a_full_disk(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if not str(f).endswith(".pt") and "last.pt" in str(f):  # the temporary of last.pt
            Path(f).write_bytes(b"PK\x03\x04 partial")
            monkeypatch.setattr(fileio.os, "statvfs", lambda p: SimpleNamespace(
                f_blocks=1000, f_bavail=0, f_frsize=4096))
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 2030336 vs 20302")
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_on_a_full_disk)
    expect("B9", cli_error(["pretrain", "--run-dir", str(run), *TINY], capsys), tmp_path)
    assert not run.exists()
    # OSError ENOSPC (a plain write) is the same error, whatever the free space
    full = pytest.raises(fileio.DiskFullError, match=r"x\.txt cannot be written: no space left")
    with full, fileio.atomic_path(tmp_path / "x.txt"):
        raise OSError(28, "No space left on device")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_full_disk_in_a_later_epoch_leaves_log_csv_as_the_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """last.pt of epoch 2 cannot be written: log.csv keeps epoch 1's row only, as last.pt does (it
    listed epoch 2, which has no checkpoint, until a --resume rewrote it). A full disk that stops the
    log itself, after last.pt of epoch 3, leaves it behind last.pt; the --resume after it, with nothing
    left to train, rewrites it from last.pt (it stayed short: only a trained epoch wrote it)."""
    import bayesncl.runs.rundir as rundir_module
    from bayesncl.runs.fileio import DiskFullError

    run = tmp_path / "run"
    real_save, real_log = rundir_module.save_checkpoint, rundir_module.write_log

    def full(path: Path) -> DiskFullError:
        return DiskFullError(f"{path} cannot be written: no space left on the file system of {run}; …")

    def save(path: Path, *args: Any) -> None:
        if path.name == "last.pt" and args[3].epoch == 2:
            raise full(path)
        real_save(path, *args)

    def write_log(
        run_dir: Path, rows: list[dict[str, Any]], name: str = "log.csv", fields: Any = None
    ) -> None:
        if len(rows) == 3:
            raise full(run_dir / name)
        real_log(run_dir, rows, name, fields)

    def epochs_logged() -> list[str]:
        return [r.split(",")[0] for r in (run / "log.csv").read_text().splitlines()]

    monkeypatch.setattr(rundir_module, "save_checkpoint", save)
    args = ["pretrain", "--run-dir", str(run), *TINY_BASE, "train.epochs=3", "--no-eval"]
    assert cli_error(args, capsys).startswith(E + f"{run / 'last.pt'} cannot be written: no space left")
    assert torch.load(run / "last.pt", weights_only=True)["epoch"] == 1
    assert epochs_logged() == ["epoch", "1"]
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "epoch-0001.pt", "last.pt", "log.csv"]

    monkeypatch.setattr(rundir_module, "save_checkpoint", real_save)
    monkeypatch.setattr(rundir_module, "write_log", write_log)
    assert cli_error([*args, "--resume"], capsys).startswith(E + f"{run / 'log.csv'} cannot be written")
    assert torch.load(run / "last.pt", weights_only=True)["epoch"] == 3
    assert epochs_logged() == ["epoch", "1", "2"]

    monkeypatch.setattr(rundir_module, "write_log", real_log)
    assert main([*args, "--resume"]) == 0
    assert epochs_logged() == ["epoch", "1", "2", "3"]


def test_extract_out_must_be_a_features_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`extract RUN --out RUN/last.pt` replaced the run's checkpoint with a features .npz (exit 0)."""
    run = tmp_path / "run"
    run.mkdir()
    tiny_checkpoint(run / "last.pt", [])
    (run / "config.yaml").write_text("kept")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    expect("B10", cli_error(["extract", str(run), "--out", str(run / "last.pt")], capsys), tmp_path)
    assert cli_error(["extract", str(run), "--out", str(run / "config.yaml")], capsys) == E + (
        f"--out {run / 'config.yaml'}: expected a .npz file path (a features file)\n"
    )
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert main(["extract", str(run), "--out", str(tmp_path / "f.NPZ")]) == 0
    assert np.load(tmp_path / "f.NPZ")["features"].shape[0] == 60


@pytest.mark.slow
def test_a_users_files_in_the_run_dir_are_not_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder without a run but with a user's config.yaml: a run replaced it silently; and
    --overwrite deleted every *.png in the folder, the user's own pictures included."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "config.yaml").write_text("my: settings\n")
    (proj / "metrics.json").write_text("{}")
    (proj / "photo.png").write_bytes(b"mine")
    args = ["pretrain", "--run-dir", str(proj), *TINY, "--no-eval"]
    expect("B11", cli_error(args, capsys), tmp_path)
    assert (proj / "config.yaml").read_text() == "my: settings\n"
    assert sorted(p.name for p in proj.iterdir()) == ["config.yaml", "metrics.json", "photo.png"]
    (proj / "config.yaml").unlink()
    (proj / "metrics.json").unlink()
    assert main(args) == 0  # the run's own figure names are not photo.png
    assert main([*args, "--overwrite"]) == 0
    assert (proj / "photo.png").read_bytes() == b"mine" and (proj / "last.pt").exists()
    # what a run killed before its first checkpoint leaves (its own config.yaml) a rerun may replace
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "config.yaml").write_text((proj / "config.yaml").read_text())
    assert main(["pretrain", "--run-dir", str(killed), *TINY, "--no-eval"]) == 0


# ----------------------------------------------------------------------------- the docs table
def test_every_row_of_the_docs_table_is_tested() -> None:
    for row, (message, test) in doc_rows().items():
        file, _, name = test.partition("::")
        source = (TESTS / file).read_text()
        assert re.search(rf"^def {re.escape(name)}\(", source, re.M), f"{row}: no test {test}"
        checks_rows = file == "app/test_bad_inputs.py" or re.search(r"\bexpect\(", source)  # not T1-T3's
        assert message and (f'"{row}"' in source or not checks_rows), f"{row}: untested"


@pytest.mark.slow
def test_out_of_memory_in_the_end_of_training_evaluation_keeps_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OOM after training, in the evaluation: it names eval.batch_size (not train.batch_size, which
    does not decide it) and says the trained run is kept and how to evaluate it."""
    import bayesncl.app.evaluate as pipeline_module

    def oom(*args: object, **kwargs: object) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has ...")

    monkeypatch.setattr(pipeline_module, "evaluate_model", oom)
    run = tmp_path / "run"
    err = cli_error(["pretrain", "--run-dir", str(run), *TINY], capsys)
    assert err == E + (
        "out of memory on the GPU (tried to allocate 3.00 GiB): lower eval.batch_size (or data.image_size), "
        f"in the end-of-training evaluation; training is complete ({run}/last.pt): `bayesncl evaluate "
        f"{run} eval.batch_size=N` evaluates it\n"
    )
    assert (run / "last.pt").is_file() and (run / "encoder.safetensors").is_file()


@pytest.mark.slow
def test_pretrain_into_a_demo_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`pretrain --run-dir <a demo's run dir>` trained beside the demo's ncl/ and bayesncl/ runs and
    its table (nothing replaced, the two mixed), while `demo` into a pretrain run dir is refused."""
    demo = tmp_path / "demo"
    for name in ("ncl", "bayesncl"):
        (demo / name).mkdir(parents=True)
        (demo / name / "log.csv").write_text("epoch\n1\n")
    (demo / "table.md").write_text("| method |\n")
    before = sorted(p.relative_to(demo) for p in demo.rglob("*"))
    for extra in ([], ["--overwrite"]):
        args = ["pretrain", "--run-dir", str(demo), *TINY, "--no-eval", *extra]
        expect("G3", cli_error(args, capsys), tmp_path)
        assert sorted(p.relative_to(demo) for p in demo.rglob("*")) == before
    # a run's own folders hold no checkpoint or log: a finished run with an eval folder resumes as before
    run = tmp_path / "run"
    assert main(["pretrain", "--run-dir", str(run), *TINY, "--no-eval"]) == 0
    (run / "eval-epoch-0001").mkdir()
    (run / "eval-epoch-0001" / "metrics.json").write_text("{}")
    assert main(["pretrain", "--run-dir", str(run), *TINY, "--no-eval", "--overwrite"]) == 0
    # a hidden folder is not a demo's run: e.g. a previous run an --overwrite set aside (.replaced-PID)
    (tmp_path / "new" / ".aside").mkdir(parents=True)
    (tmp_path / "new" / ".aside" / "log.csv").write_text("epoch\n1\n")
    assert main(["pretrain", "--run-dir", str(tmp_path / "new"), *TINY, "--no-eval"]) == 0


def test_a_demo_or_table_into_a_pretrain_run_dir_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The mirror of G3: `demo --overwrite` (told "--overwrite to replace it" for a folder with files)
    and `reproduce` into a pretrain run dir trained their runs in its folders, beside the run (nothing
    replaced, the two mixed)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "last.pt").write_bytes(b"x")
    (run / "log.csv").write_text("epoch\n1\n")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    expect("H1", cli_error(["demo", "--run-dir", str(run), "--overwrite", *TINY], capsys), tmp_path)
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    args = ["reproduce", "7", "--dataset", "fashion-mnist", "--run-dir", str(run), *TINY]
    expect("H2", cli_error(args, capsys), tmp_path)
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_a_key_given_as_a_sections_key_and_a_dotted_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A YAML key ``method.rho`` names the same setting as ``rho`` of a ``method:`` section: given both,
    the last one was kept silently (the F2 defect, across two spellings)."""
    (tmp_path / "dup.yaml").write_text("method:\n  rho: 0.5\nmethod.rho: 0.6\n")
    args = ["pretrain", "--run-dir", str(tmp_path / "r"), *TINY, "--config", str(tmp_path / "dup.yaml")]
    expect("H3", cli_error(args, capsys), tmp_path)
    assert not (tmp_path / "r").exists()
    (tmp_path / "ok.yaml").write_text("method:\n  rho: 0.5\ntrain.epochs: 3\n")  # each once: as before
    assert load_yaml(tmp_path / "ok.yaml") == {"method.rho": 0.5, "train.epochs": 3}
