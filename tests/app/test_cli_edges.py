"""Edge cases found by a fresh-eyes pass: each gets one line, nothing mixed, nothing lost."""

from __future__ import annotations

import errno
import json
import signal
from pathlib import Path

import numpy as np
import pytest
import yaml

from bayesncl.app.cli import main
from bayesncl.app.train import pretrain
from bayesncl.config import ConfigError, build_config

from ..conftest import SRC, TINY, TINY_BASE, error_line, image_folder, tiny_checkpoint


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.epochs=inf", "train.epochs='inf': expected int"),
        ("method.lam=inf", "method.lam='inf': expected a finite number"),
        ("method.rho=nan", "method.rho='nan': expected a finite number"),
        ("train.momentum=-1", "train.momentum=-1.0: expected 0 <= momentum < 1"),
        ("data.blur_prob=5", "data.blur_prob=5.0: expected 0 <= p <= 1"),
        ("eval.batch_size=0", "eval.batch_size=0: expected >= 1"),
        ("train.lars_eta=0", "train.lars_eta=0.0: expected > 0"),
    ],
)
def test_more_range_checks(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        build_config(overrides=[override])
    assert str(e.value) == message


def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce", "8"]) == 2
    assert error_line(capsys) == (
        "bayesncl: error: reproduce '8': no such table or figure; expected one of 1, 2, 3, 4, 5, 7, 9, "
        "15, appj, convergence, fig3, fig4a, fig4b, headline, ncl-dead, ncl-finetune, ncl-fs, ncl-mig, "
        "ncl-ood, ncl-sepin, ncl-sparsity, ncl-spectral, ncl-supervised, 6, mechanism"
    )
    with pytest.raises(SystemExit) as e:
        main(["reproduce", "1", "--seeds", "two"])
    assert e.value.code == 2
    assert "argument --seeds: invalid int value: 'two'" in error_line(capsys)
    # an unknown option is reported by the subcommand's parser: no doubled prefix, its own --help
    for command in ("pretrain", "demo", "benchmark"):
        with pytest.raises(SystemExit):
            main([command, "--bogus", "x=1"])
        hint = f"(see bayesncl {command} --help)"
        assert error_line(capsys) == f"bayesncl: error: unrecognized arguments: --bogus {hint}"
    with pytest.raises(SystemExit):
        main(["--bogus"])
    assert error_line(capsys) == "bayesncl: error: unrecognized arguments: --bogus (see bayesncl --help)"


def test_empty_paths_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "f.npz", features=rng.random((20, 8)).astype(np.float32), labels=np.arange(20) % 2)
    source = "expected a run dir or checkpoint file"
    cases = [
        (["pretrain", "--config", "", *TINY], "--config '': expected a YAML file or recipe name"),
        (["extract", str(tmp_path), "--out", ""], "--out '': expected a .npz file path"),
        (["extract", ""], f"RUN_DIR_OR_CHECKPOINT '': {source}"),
        (["evaluate", " "], f"RUN_DIR_OR_CHECKPOINT ' ': {source}"),
        (["dynamics", ""], "RUN_DIR '': expected a run dir"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert error_line(capsys) == f"bayesncl: error: {message}, not an empty path"


def test_bad_retrieval_dims_and_out_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    f = tmp_path / "f.npz"
    np.savez(f, features=rng.random((20, 8)).astype(np.float32), labels=np.arange(20) % 2)
    for bad in ("abc", "32,,64", "", "0,8", "8,-1", ","):
        assert main(["metrics", str(f), "--retrieval-dims", bad]) == 2, bad
        assert f"--retrieval-dims {bad!r}: expected comma-separated positive integers" in error_line(capsys)
    assert main(["metrics", str(f), "--retrieval-dims", " 4, 8"]) == 0
    assert main(["extract", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert "is a directory" in error_line(capsys)


@pytest.mark.slow
def test_overwrite_removes_the_previous_runs_files(tmp_path: Path) -> None:
    run = tmp_path / "run"
    pretrain(build_config(overrides=[*TINY_BASE, "train.epochs=2"]), run)
    assert (run / "epoch-0002.pt").exists() and (run / "metrics.json").exists()
    pretrain(build_config(overrides=TINY), run, overwrite=True, evaluate=False)
    assert not (run / "epoch-0002.pt").exists() and not (run / "metrics.json").exists()
    assert (run / "epoch-0001.pt").exists()


@pytest.mark.slow
def test_resume_extends_and_records_the_new_length(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main(["pretrain", "--run-dir", str(run), *TINY, "--no-eval"]) == 0
    # train.epochs may grow and cosmetic keys may change; config.yaml then says what was run
    assert (
        main(
            [
                "pretrain",
                "--run-dir",
                str(run),
                "--resume",
                "train.epochs=2",
                "train.progress=true",
                "--no-eval",
            ]
        )
        == 0
    )
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["epochs"] == 2
    assert (run / "epoch-0002.pt").exists()


@pytest.mark.slow
def test_sigint_handler_is_restored_after_training(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGINT)
    pretrain(build_config(overrides=TINY), tmp_path / "run", evaluate=False)
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.slow
def test_reproduce_times_from_the_log_and_other_settings_are_other_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "reproduce",
        "7",
        "--dataset",
        "cifar10",
        "--run-dir",
        str(tmp_path / "t7"),
        *TINY,
        "data.root=none",
        "eval.retrieval_dims=8",
    ]
    assert main(args) == 0
    table = json.loads((tmp_path / "t7" / "table7.json").read_text())
    runs = {name: tmp_path / "variants" / h for name, h in table["runs"].items()}
    assert (runs["BayesNCL seed 0"] / "metrics.json").exists()  # the store: variants/ beside the run dir
    # minutes: the logged epoch times (training alone), not the wall time around pretrain + evaluation
    for variant in ("NCL", "BayesNCL"):
        rows = (runs[f"{variant} seed 0"] / "log.csv").read_text().splitlines()
        col = rows[0].split(",").index("epoch_time_s")
        logged = sum(float(r.split(",")[col]) for r in rows[1:]) / 60
        cell = table["rows"][variant]["pretrain_minutes"]
        assert cell["values"] == [pytest.approx(logged, abs=1e-6)] and cell["mean"] > 0
    assert (tmp_path / "t7" / "curves.png").read_bytes().startswith(b"\x89PNG")  # every variant's log
    # other settings are other runs: trained beside the first ones, which stay as they were
    assert main([*args, "train.epochs=2"]) == 0
    again = json.loads((tmp_path / "t7" / "table7.json").read_text())
    assert len(again["trained"]) == 2 and not set(again["trained"]) & set(table["runs"].values())
    assert all((tmp_path / "variants" / h / "metrics.json").exists() for h in table["runs"].values())


def test_checkpoint_and_features_file_swapped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    np.savez(tmp_path / "f.npz", features=np.ones((4, 2), np.float32), labels=np.arange(4))
    torch.save({"state_dict": {"w": torch.ones(3)}}, tmp_path / "c.pt")
    assert main(["metrics", str(tmp_path / "c.pt")]) == 2
    assert "is a PyTorch checkpoint, not a features file: run `bayesncl extract" in error_line(capsys)
    assert main(["extract", str(tmp_path / "f.npz")]) == 2
    assert "is a NumPy .npz (a features file?), not a checkpoint" in error_line(capsys)


def test_metrics_json_has_exactly_the_issue_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "f.npz", features=rng.random((40, 8)).astype(np.float32), labels=np.arange(40) % 4)
    assert main(["metrics", str(tmp_path / "f.npz"), "--json", "--retrieval-dims", "4,8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {
        "semantic_consistency",
        "semantic_entropy_sum",
        "semantic_entropy_mean",
        "semantic_entropy_freq",
        "cluster_entropy",  # issue 47: the NCL code's main_eval number
        "active_dims",
        "activation_ratio",
        "sparsity",
        "nonneg_ratio",  # issue 47: the NCL code's logged non_neg_ratio
        "effective_rank",
        "orthogonality",
        "retrieval",
        "ncl_map",  # issue 26: the NCL repository's own retrieval number, beside ours
    }
    assert set(out["retrieval"]) == {"4", "8"}
    assert set(out["retrieval"]["4"]) == {"P@1", "P@3", "P@5", "P@10", "mAP@10"}


@pytest.mark.slow
def test_resume_with_overwrite_and_yaml_position(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pretrain", "--run-dir", str(tmp_path / "r"), "--resume", "--overwrite"]) == 2
    assert "--resume and --overwrite contradict each other" in error_line(capsys)
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  epochs: [1, 2\n")
    with pytest.raises(ConfigError, match=r"is not valid YAML at line 3, column 1"):
        build_config(bad)


@pytest.mark.slow
def test_resume_cannot_shrink_and_reproduce_keeps_variant_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    assert main(["pretrain", "--run-dir", str(run), *TINY_BASE, "train.epochs=2", "--no-eval"]) == 0
    assert main(["pretrain", "--run-dir", str(run), "--resume", "train.epochs=1"]) == 2
    shrink = "train.epochs=1 is fewer than 2: the run has done 2 epochs; give train.epochs >= 2"
    assert shrink in error_line(capsys)
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["epochs"] == 2
    assert main(["reproduce", "2", "--dataset", "fashion-mnist", "method.name=cl"]) == 2
    assert error_line(capsys) == (
        "bayesncl: error: method.name defines the variants of table 2; it cannot be overridden here"
    )
    assert main(["reproduce", "4", "--dataset", "fashion-mnist", "method.detach=1", "method.gate=none"]) == 2
    assert error_line(capsys) == (
        "bayesncl: error: method.detach, method.gate define the variants of table 4; they cannot be "
        "overridden here"
    )
    assert main(["dynamics", str(tmp_path / "nope")]) == 2
    assert error_line(capsys) == f"bayesncl: error: {tmp_path / 'nope'}: no such run dir"
    assert main(["dynamics", str(run / "last.pt")]) == 2
    assert error_line(capsys) == (
        f"bayesncl: error: {run / 'last.pt'} is a file: dynamics expects a run dir (the folder holding its "
        "epoch-NNNN.pt checkpoints)"
    )
    assert main(["dynamics", str(run), "--samples", "1"]) == 2
    assert "--samples 1: expected >= 2" in error_line(capsys)
    # dynamics.json records the settings it was computed with
    assert main(["dynamics", str(run), "--samples", "32", "--every", "2"]) == 0
    saved = json.loads((run / "dynamics.json").read_text())
    assert (saved["samples"], saved["every"], saved["checkpoints"]) == (32, 2, ["epoch-0001.pt"])
    assert [r["epoch"] for r in saved["rows"]] == [1]


@pytest.mark.parametrize(
    "command",
    ["", "pretrain", "demo", "extract", "metrics", "evaluate", "dynamics", "reproduce", "benchmark"],
)
def test_help_is_plain_text(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"] if command else ["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: ") and len(text) > 200
    for markup in ("``", ":func:", ":class:", ":mod:", ":data:"):
        assert markup not in text, (command, markup)


@pytest.mark.slow
def test_evaluate_honours_probe_none_and_writes_nothing_on_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from PIL import Image


    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("val", 6)):  # one class; a 6-image test split
        (tmp_path / "folder" / split / "only").mkdir(parents=True)
        for i in range(n):
            img = rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)
            Image.fromarray(img).save(tmp_path / "folder" / split / "only" / f"{i}.png")
    folder = ["data.name=imagefolder", f"data.root={tmp_path / 'folder'}", "data.train_subset=0",
              "data.test_subset=0"]
    ckpt = str(tiny_checkpoint(tmp_path / "one.pt", folder, num_classes=1))

    def files() -> list[str]:
        return sorted(p.name for p in tmp_path.iterdir() if p.is_file())

    capsys.readouterr()
    assert main(["evaluate", ckpt]) == 2  # the run's eval.probe is fast
    assert error_line(capsys) == (
        "bayesncl: error: imagefolder has 1 class: the linear probe needs >= 2; pass --probe none or "
        "eval.probe=none"
    )
    assert main(["evaluate", ckpt, "--probe", "fast", "eval.probe=none"]) == 2
    assert error_line(capsys) == "bayesncl: error: --probe fast contradicts eval.probe=none: give one of them"
    # asked for explicitly, retrieval on 6 test images stays an error
    assert main(["evaluate", ckpt, "eval.probe=none", "--retrieval-dims", "8"]) == 2
    assert error_line(capsys) == "bayesncl: error: retrieval needs at least 11 samples for depth 10; got N=6"
    assert files() == ["one.pt"]  # no features_test.npz from a failed evaluation

    for how in (["eval.probe=none"], ["--probe", "none"]):
        assert main(["evaluate", ckpt, *how]) == 0, how
        result = json.loads((tmp_path / "evaluation.json").read_text())
        assert not any(k.startswith(("linear_probe", "feature_selection")) for k in result), how
        assert "retrieval" not in result
        assert result["retrieval_note"] == (
            "retrieval skipped: it needs at least 11 test samples (P@10, mAP@10); got 6"
        )
        assert result["knn_acc1"] == 100.0  # one class: every vote is right
        assert "No linear probe (eval.probe=none)." in (tmp_path / "evaluation.md").read_text()
        assert {"features_test.npz", "evaluation.json", "evaluation.md"} <= set(files())
        assert len(np.load(tmp_path / "features_test.npz")["labels"]) == 6


def test_run_dir_is_announced_only_once_it_is_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    missing = f"data.root={tmp_path}/nowhere"
    assert main(["pretrain", "--run-dir", str(run), "data.name=cifar10", missing]) == 2
    out = capsys.readouterr()
    assert "run dir:" not in out.out and out.err.startswith("bayesncl: error: ") and not run.exists()


@pytest.mark.slow
def test_reproduce_2_extracts_each_split_once_per_variant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from bayesncl.app import evaluate as pipeline

    calls: list[str] = []
    real = pipeline.extract_split

    def counted(model, cfg, split, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(split)
        return real(model, cfg, split, *args, **kwargs)

    monkeypatch.setattr(pipeline, "extract_split", counted)
    run = tmp_path / "t2"
    args = ["reproduce", "2", "--dataset", "cifar10", "--run-dir", str(run), *TINY, "data.root=none"]
    args.append("eval.retrieval_dims=8")
    assert main(args) == 0
    # CL, NCL, BayesNCL: pretrain's evaluation, then the features table 2 keeps (kNN, 3 probe seeds)
    assert sorted(calls) == ["test"] * 6 + ["train"] * 6
    table = json.loads((run / "table2.json").read_text())
    for name in ("CL", "NCL", "BayesNCL"):
        cells = table["rows"][name]
        assert 0 <= cells["knn_acc1"]["mean"] <= 100 and 0 <= cells["lp3_acc1"]["mean"] <= 100
    calls.clear()
    assert main(args) == 0  # finished variants are reused, not evaluated again
    assert calls == []
    assert "CL seed 0: reuse" in capsys.readouterr().out


@pytest.mark.slow
def test_an_earlier_checkpoint_of_a_run_is_evaluated_into_its_own_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``evaluate RUN/epoch-0001.pt`` (or ``extract``) wrote features_test.npz, evaluation.json/.md and
    the figures over the run's final ones, with nothing saying they were epoch 1's."""
    import torch

    from bayesncl.runs.features import load_features


    run = tmp_path / "run"
    run.mkdir()
    tiny_checkpoint(run / "last.pt", [])
    torch.manual_seed(1)  # other weights than last.pt
    tiny_checkpoint(run / "epoch-0001.pt", [])
    final = {"evaluation.json": "{}\n", "evaluation.md": "final\n", "features_test.npz": "final"}
    for name, text in final.items():
        (run / name).write_text(text)
    assert main(["evaluate", str(run / "epoch-0001.pt"), "--probe", "none", "--no-knn"]) == 0
    assert main(["extract", str(run / "epoch-0001.pt"), "--split", "train"]) == 0
    capsys.readouterr()
    for name, text in final.items():
        assert (run / name).read_text() == text, name
    own = run / "eval-epoch-0001"
    assert {"evaluation.json", "evaluation.md", "features_test.npz", "features_train.npz"} <= {
        p.name for p in own.iterdir()
    }
    assert json.loads((own / "evaluation.json").read_text())["method"] == "bayesncl"
    assert load_features(own / "features_train.npz").meta["source"] == str(run / "epoch-0001.pt")
    # the run's own last.pt (and the run dir) still write into the run dir
    assert main(["extract", str(run / "last.pt")]) == 0
    assert load_features(run / "features_test.npz").meta["source"] == str(run / "last.pt")


@pytest.mark.slow
def test_evaluate_on_a_dataset_with_other_classes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run trained on 10 classes, extracted and evaluated on a 2-class image folder (same channels
    and size): only the online probe's head has another shape, and it is not used. It was refused as
    "does not fit the architecture its config describes: shape mismatch: classifier.weight ..."."""
    from bayesncl.runs.features import load_features


    ckpt = tiny_checkpoint(tmp_path / "syn.pt", [], 3)
    folder = image_folder(tmp_path / "folder", n=8)
    data = ["data.name=imagefolder", f"data.root={folder}", "data.train_subset=0", "data.test_subset=0"]
    out = tmp_path / "f.npz"
    with pytest.warns(UserWarning, match="classifier has 10 classes but data.name=imagefolder has 2;"):
        assert main(["extract", str(ckpt), "--out", str(out), *data]) == 0
    fs = load_features(out)
    assert fs.features.shape == (12, 16)  # 2 classes x 6 val images, D=16
    assert sorted(set(fs.labels.tolist())) == [0, 1]
    with pytest.warns(UserWarning, match="online classifier has 10 classes"):
        assert main(["evaluate", str(ckpt), "--no-knn", *data]) == 0
    result = json.loads((tmp_path / "evaluation.json").read_text())
    assert 0.0 <= result["linear_probe_acc1"] <= 100.0
    assert result["semantic_consistency"] >= 50.0  # 2 classes: a majority of at least half


def test_pretrain_minutes_sum_the_logged_epochs(tmp_path: Path) -> None:
    """Table 7's minutes: 30 s + 90 s of epochs = 2 min, whatever happened around them (a resume
    rewrites log.csv with every epoch of the run, so a resumed variant counts all of them)."""
    from bayesncl.paper.reproduce import pretrain_minutes
    from bayesncl.runs.logs import LOG_FIELDS, write_log

    rows = [{k: 0 for k in LOG_FIELDS} | {"epoch": e, "epoch_time_s": t} for e, t in ((1, 30.0), (2, 90.0))]
    write_log(tmp_path, rows)
    assert pretrain_minutes(tmp_path) == pytest.approx(2.0)


@pytest.mark.slow
def test_pretrain_into_a_folder_with_an_unreadable_subfolder_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check for runs in the run dir's folders (G3) looks inside each one: a folder it may not
    look into (another user's, a disk's lost+found) raised PermissionError, a traceback. Such a folder
    is not a run of this user's; the run trains (as root here, the denial is simulated)."""
    run = tmp_path / "shared"
    (run / "lost+found").mkdir(parents=True)
    real_exists = Path.exists

    def exists(self: Path, *args: object, **kwargs: object) -> bool:
        if self.parent.name == "lost+found":
            raise PermissionError(13, "Permission denied", str(self))
        return real_exists(self, *args, **kwargs)

    monkeypatch.setattr(Path, "exists", exists)
    assert main(["pretrain", "--run-dir", str(run), *TINY, "--no-eval"]) == 0
    assert (run / "last.pt").is_file()


def test_a_min_lr_above_the_peak_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """train.min_lr above the peak (0.4 x 32 / 256 = 0.05) is refused (F3)."""
    assert main(["pretrain", "--run-dir", str(tmp_path / "new"), *TINY, "train.min_lr=0.5"]) == 2
    assert "bayesncl: error: train.min_lr=0.5: expected <= the peak" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the error layer
@pytest.mark.parametrize(
    ("code", "words"),
    [
        (errno.EROFS, "read-only file system; choose a folder on a writable file system"),
        (errno.EACCES, "permission denied; choose a folder you may write to, or change its permissions"),
        (errno.EPERM, "operation not permitted; choose a folder you may write to, or change its permissions"),
        (errno.ENAMETOOLONG, "file name too long; choose a shorter path"),
        (errno.ENOSPC, "cannot be written: no space left on the file system of"),
    ],
)
def test_an_operating_system_fault_is_one_line(
    code: int, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write the system refuses (here the first: the run's config.yaml, by os.replace of its
    temporary) is one line naming the file as the user knows it, not the temporary, and exit 2."""
    import os

    def refuse(src: object, dst: object) -> None:
        raise OSError(code, os.strerror(code), str(src), None, str(dst))

    monkeypatch.setattr(os, "replace", refuse)
    run = tmp_path / "run"
    assert main(["pretrain", "--run-dir", str(run), *TINY, "--no-eval"]) == 2
    line = error_line(capsys)
    assert f"{run / 'config.yaml'}" in line and words in line and ".tmp" not in line, line


def test_a_real_name_too_long_is_one_line_and_shortened(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    long = tmp_path / ("a" * 300) / "run"
    assert main(["pretrain", "--run-dir", str(long), *TINY, "--no-eval"]) == 2
    line = error_line(capsys)
    assert "file name too long" in line and "a" * 101 not in line and "…" in line, line
    assert main(["curves", str(tmp_path / ("b" * 5000))]) == 2  # any value over 200 characters
    assert max(len(w) for w in error_line(capsys).split()) <= 201


def test_shorten_keeps_head_and_tail() -> None:
    from bayesncl.app.errors import os_fault, shorten

    assert shorten("x " + "y" * 300 + " z") == "x " + "y" * 100 + "…" + "y" * 100 + " z"
    assert shorten("short words stay") == "short words stay"
    e = OSError(errno.EROFS, "Read-only file system", "/r/.last.pt.tmp123")
    assert os_fault(e) == "/r/last.pt: read-only file system; choose a folder on a writable file system"
    assert os_fault(OSError("no errno")) is None and os_fault(ValueError("x")) is None


def _closed_stdout(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``python -m bayesncl ARGS`` whose stdout's reader has gone before it writes anything."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(SRC)}
    p = subprocess.Popen(
        [sys.executable, "-m", "bayesncl", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env,
    )
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()
    err = p.stderr.read().decode()
    return p.wait(), err


@pytest.mark.integration
def test_a_closed_pipe_on_stdout_is_no_error(tmp_path: Path) -> None:
    """``bayesncl metrics x.npz | head -1``: what cannot be printed is dropped, silently, with the
    command's own exit status; ``| head -1`` through a real shell pipe prints its line."""
    import subprocess
    import sys

    rng = np.random.default_rng(0)
    feats = tmp_path / "f.npz"
    np.savez(feats, features=rng.random((100, 32)).astype(np.float32), labels=rng.integers(0, 5, 100))
    assert _closed_stdout(["metrics", str(feats)], tmp_path) == (0, "")
    shell = f"PYTHONPATH={SRC} {sys.executable} -m bayesncl metrics {feats} | head -1"
    out = subprocess.run(["bash", "-o", "pipefail", "-c", shell], capture_output=True, text=True)
    assert (out.returncode, out.stderr, out.stdout) == (0, "", f"Features: {feats} (N=100, D=32)\n")


@pytest.mark.integration
def test_a_closed_stdout_never_stops_training(tmp_path: Path) -> None:
    run = tmp_path / "run"
    rc, err = _closed_stdout(["pretrain", "--run-dir", str(run), *TINY, "--no-eval"], tmp_path)
    assert (rc, "Traceback" in err) == (0, False), err
    assert (run / "last.pt").exists() and (run / "encoder.safetensors").exists()


@pytest.mark.slow
def test_evaluate_reports_the_gate_and_the_test_size(tmp_path: Path) -> None:
    """``evaluation.json`` of a gated run holds the gate-open rate, the rows with every gate closed and
    the test size (as ``metrics.json`` does), computed from the hard mask 1[α > 0.5] also under
    ``eval.use_soft_gating``, whose features file keeps ``mask`` 0/1 (and loads so, where an older
    one held α there); one probe seed has no std."""
    from bayesncl.metrics.background import gate_closure
    from bayesncl.runs.features import load_features, save_features

    ckpt = str(tiny_checkpoint(tmp_path / "run.pt", ["method.name=bayesncl"]))
    for soft in ("false", "true"):
        assert main(["evaluate", ckpt, "--probe", "fast", f"eval.use_soft_gating={soft}"]) == 0
        result = json.loads((tmp_path / "evaluation.json").read_text())
        fs = load_features(tmp_path / "features_test.npz")
        assert fs.meta["soft_gating"] == (soft == "true") and fs.alpha is not None and fs.z is not None
        hard = fs.alpha > 0.5  # by hand from α
        assert np.array_equal(fs.mask, hard) and not np.allclose(hard.mean(0), fs.alpha.mean(0), atol=0.01)
        assert result["n_test"] == len(hard) == 60
        assert result["gate_open_rate"] == pytest.approx(hard.mean(), abs=1e-7)
        assert result["rows_all_closed"] == pytest.approx((hard.sum(1) == 0).mean())
        fire = fs.z > 0
        closed = (fire & ~hard).sum(0) / np.maximum(fire.sum(0), 1)
        assert np.allclose(np.nan_to_num(gate_closure(fs.z, fs.mask)), np.where(fire.any(0), closed, 0))
        assert "linear_probe_acc1" in result and "linear_probe_acc1_std" not in result
    old = save_features(tmp_path / "old.npz", features=fs.features, labels=fs.labels, alpha=fs.alpha,
                        mask=fs.alpha, meta=fs.meta)  # fmt: skip
    assert np.array_equal(load_features(old).mask, hard)  # an older soft-gated file: α read as 1[α > 0.5]


def test_the_finished_line_names_what_the_run_dir_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its folders too (tensorboard/, a longer --resume's results-epoch-N/), the periodic checkpoints
    counted, hidden files (the lock, temporaries) left out."""
    from bayesncl.app.train import _report_written

    for name in ("config.yaml", "log.csv", "wandb-id.txt", "epoch-0001.pt", "epoch-0002.pt", ".bayesncl.lock",
                 ".last.pt.tmp123"):
        (tmp_path / name).write_text("")
    for folder in ("tensorboard", "results-epoch-0001"):
        (tmp_path / folder).mkdir()
    _report_written(tmp_path, 61.4)
    assert capsys.readouterr().out == (
        f"pretrain finished in 0:01:01: {tmp_path} holds config.yaml, log.csv, results-epoch-0001/, "
        "tensorboard/, wandb-id.txt, 2 x epoch-NNNN.pt\n"
    )


def test_version_installed_and_from_a_source_tree(monkeypatch, capsys) -> None:
    """`--version` reads the installed distribution; uninstalled (PYTHONPATH=src, as on the GPU
    machine) it falls back to the package's own __version__ instead of a traceback."""
    import importlib.metadata

    import bayesncl
    from bayesncl.app import cli

    assert cli._version() == importlib.metadata.version("bayesncl")

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(cli, "version", missing)
    assert cli._version() == f"{bayesncl.__version__} (source tree, not installed)"
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"bayesncl {bayesncl.__version__} (source tree, not installed)"
