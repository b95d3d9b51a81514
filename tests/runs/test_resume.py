"""Crash-proof resume and training guards, end to end on tiny synthetic data (CPU).

- SIGKILL during epoch 3, then ``--resume``: the same final weights as an uninterrupted run, bit for
  bit, and nothing lost beyond the last checkpoint (one epoch).
- SIGINT / SIGTERM: the mid-epoch state goes to ``last.pt``, the exit is clean (status 130 / 143,
  one line), and ``--resume`` continues from that step, bit-identical to an uninterrupted run.
- Non-finite loss: a one-line error naming the step and the loss parts; the last good checkpoint
  is kept.
- fp16 overflow: the grad scaler skips the step and lowers its scale; training goes on.
- Gate health: gate-open rate, ρ and fully-closed rows per epoch; a warning on collapse.
"""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import bayesncl.app.train as train_module
import bayesncl.core.engine as engine_module
import bayesncl.runs.rundir as rundir_module
from bayesncl.app.cli import main
from bayesncl.app.evaluate import load_trained
from bayesncl.app.train import pretrain
from bayesncl.config import build_config
from bayesncl.core.engine import TrainingError
from bayesncl.runs.safe_load import load_checkpoint_file

from ..conftest import TINY_BASE, assert_same_weights, ctrl_c, signal_at, start_cli, wait_for

# fp32 on every CPU: with the default `auto`, a CPU with native bf16 trains in bf16 (issue 23), and the
# resume tests must test the same thing on either kind of CPU; bf16's own resume test is further down
TINY = [*TINY_BASE, "method.name=bayesncl", "method.lam=0.01", "train.precision=fp32"]

def run_cli(args: list[str]) -> tuple[int, str, str]:
    p = start_cli(args)
    out, err = p.communicate(timeout=120)
    return p.returncode, out, err


def log_rows(run: Path) -> list[dict[str, str]]:
    try:
        with (run / "log.csv").open() as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


def straight_then_signalled(
    straight: Path, run: Path, *, epochs: int, signum: int, after_epochs: int, delay: float, wait: float
) -> subprocess.Popen[str]:
    """Train ``straight`` uninterrupted; then start the same run in ``run`` (paced by ``delay`` s a
    step) and send ``signum`` ``wait`` s after its epoch ``after_epochs`` is logged. 6 steps an epoch."""
    args = [*TINY, "data.train_subset=192", f"train.epochs={epochs}", "--no-eval"]
    code, _, err = run_cli(["pretrain", "--run-dir", str(straight), *args])
    assert code == 0, err
    proc = start_cli(["pretrain", "--run-dir", str(run), *args], delay=delay)
    wait_for(lambda: len(log_rows(run)) == after_epochs, proc)
    time.sleep(wait)
    proc.send_signal(signum)
    return proc


# ----------------------------------------------------------------------------- SIGKILL + --resume
@pytest.mark.integration
@pytest.mark.slow
def test_sigkill_in_epoch_3_then_resume_is_bit_identical(tmp_path: Path) -> None:
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    # into epoch 3 (>= 0.6 s of paced steps); epoch 2's last.pt is written by now
    proc = straight_then_signalled(
        straight, killed, epochs=4, signum=signal.SIGKILL, after_epochs=2, delay=0.1, wait=0.25
    )
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    before = log_rows(killed)
    assert [r["epoch"] for r in before] == ["1", "2"]  # killed during epoch 3
    assert load_checkpoint_file(killed / "last.pt")["epoch"] == 2  # only epoch 3's steps are lost

    code, _, err = run_cli(["pretrain", "--run-dir", str(killed), "--resume"])
    assert code == 0, err
    assert_same_weights(straight / "last.pt", killed / "last.pt")
    after, ref = log_rows(killed), log_rows(straight)
    assert after[:2] == before  # the log is restored, not rewritten
    assert [r["epoch"] for r in after] == ["1", "2", "3", "4"]
    for r, s in zip(after, ref, strict=True):
        assert {k: v for k, v in r.items() if k != "epoch_time_s"} == {
            k: v for k, v in s.items() if k != "epoch_time_s"
        }
    for name in ("encoder.safetensors", "epoch-0004.pt"):  # small_cnn: no torchvision export
        assert (killed / name).exists()


# ----------------------------------------------------------------------------- SIGINT
@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_mid_epoch_saves_last_pt_and_resume_is_bit_identical(
    tmp_path: Path, signum: int, status: int
) -> None:
    """Ctrl-C or SIGTERM (a scheduler's preemption) inside epoch 2: the step in progress finishes,
    last.pt holds the mid-epoch state, and --resume ends bit-identical to an uninterrupted run."""
    straight, run = tmp_path / "straight", tmp_path / "run"
    proc = straight_then_signalled(
        straight, run, epochs=3, signum=signum, after_epochs=1, delay=0.15, wait=0.4  # into epoch 2
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    found = re.fullmatch(
        r"bayesncl: interrupted: stopped in epoch 2 after (\d) of its 6 steps; state saved to "
        rf"{re.escape(str(run / 'last.pt'))}; --resume continues from that step",
        lines[0],
    )
    assert found, lines[0]
    n_seen = int(found.group(1))
    saved = load_checkpoint_file(run / "last.pt")
    assert (saved["epoch"], saved["step"], saved["partial"]["n_seen"]) == (1, 6 + n_seen, n_seen)
    assert 1 <= n_seen <= 6 and [r["epoch"] for r in log_rows(run)] == ["1"]
    model, cfg, _ = load_trained(run / "last.pt", device=torch.device("cpu"))
    assert cfg.method.name == "bayesncl" and all(torch.isfinite(p).all() for p in model.parameters())

    code, _, err = run_cli(["pretrain", "--run-dir", str(run), "--resume"])
    assert code == 0, err
    assert_same_weights(straight / "last.pt", run / "last.pt")
    after, ref = log_rows(run), log_rows(straight)
    assert [r["epoch"] for r in after] == ["1", "2", "3"]
    for r, s in zip(after, ref, strict=True):  # epoch 2's row includes the steps before the signal
        assert {k: v for k, v in r.items() if k != "epoch_time_s"} == {
            k: v for k, v in s.items() if k != "epoch_time_s"
        }
    assert load_checkpoint_file(run / "last.pt")["partial"] is None


@pytest.mark.slow
def test_step_log_rows_and_a_mid_epoch_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """steps.csv, a row every STEP_LOG_EVERY (here 2) steps: each row is the mean over the epoch's
    steps since the previous row, and a run interrupted between two rows resumes to the same rows."""
    from bayesncl.app.report.curves import read_log, read_steps

    monkeypatch.setattr(engine_module, "STEP_LOG_EVERY", 2)
    args = [*TINY, "train.epochs=2"]  # 96 images, batch 32: 3 steps an epoch
    straight = tmp_path / "straight"
    pretrain(build_config(overrides=args), straight, evaluate=False)
    steps, log = read_steps(straight), read_log(straight)
    assert [r["step"] for r in steps] == [2, 4, 6]
    assert [r["epoch"] for r in steps] == [0.6667, 1.3333, 2.0]
    # epoch 2 = step 4 (the row of its first step alone) + steps 5-6 (the next row): their weighted
    # mean is the epoch's mean in log.csv, for every statistic
    for key in ("loss", "info_nce", "kl", "gate_open", "online_acc"):
        assert (steps[1][key] + 2 * steps[2][key]) / 3 == pytest.approx(log[1][key], abs=1e-5), key

    real, calls = engine_module.contrastive_loss, {"n": 0}

    def ctrl_c_in_step_5(*a: Any, **k: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 5:  # between the rows of steps 4 and 6
            ctrl_c()
        return real(*a, **k)

    run = tmp_path / "run"
    monkeypatch.setattr(engine_module, "contrastive_loss", ctrl_c_in_step_5)
    with pytest.raises(rundir_module.TrainingInterrupted, match="stopped in epoch 2 after 2 of its 3 steps"):
        pretrain(build_config(overrides=args), run, evaluate=False)
    assert [r["step"] for r in read_steps(run)] == [2, 4]
    monkeypatch.setattr(engine_module, "contrastive_loss", real)
    pretrain(build_config(overrides=args), run, resume=True, evaluate=False)
    assert read_steps(run) == steps
    assert_same_weights(straight / "last.pt", run / "last.pt")


@pytest.mark.slow
def test_a_mid_epoch_resume_under_bf16_autocast_is_bit_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default ``auto`` on a (reported) native-bf16 CPU: bf16 autocast + channels-last. A run
    stopped inside epoch 2 and resumed ends with the same weights, optimiser state and log rows as
    an uninterrupted one, bit for bit: the bf16 kernels are as deterministic as the fp32 ones, and
    the weights and optimiser state they update are fp32."""
    from bayesncl.core import optim

    monkeypatch.setattr(optim, "native_cpu_bf16", lambda flags=None: "AVX512-BF16")
    args = [*TINY_BASE, "method.name=bayesncl", "method.lam=0.01", "train.epochs=2"]  # auto; 3 steps/epoch
    straight, run = tmp_path / "straight", tmp_path / "run"
    pretrain(build_config(overrides=args), straight, evaluate=False)
    assert "precision: bf16 autocast + channels-last (train.precision=auto" in capsys.readouterr().out
    with monkeypatch.context() as m:
        signal_at(m, engine_module, "train_step", (5,))  # inside epoch 2
        stopped = "stopped in epoch 2 after 2 of its 3 steps"
        with pytest.raises(rundir_module.TrainingInterrupted, match=stopped):
            pretrain(build_config(overrides=args), run, evaluate=False)
    pretrain(build_config(overrides=args), run, resume=True, evaluate=False)
    assert_same_weights(straight / "last.pt", run / "last.pt")
    a, b = load_checkpoint_file(straight / "last.pt"), load_checkpoint_file(run / "last.pt")
    opt_a, opt_b = a["optimizer"]["state"], b["optimizer"]["state"]
    assert a["step"] == b["step"] == 6 and opt_a.keys() == opt_b.keys()
    for k in opt_a:
        assert all(torch.equal(v, opt_b[k][n]) for n, v in opt_a[k].items() if torch.is_tensor(v)), k

    def rows(r: Path) -> list[dict[str, str]]:
        return [{k: v for k, v in row.items() if k != "epoch_time_s"} for row in log_rows(r)]

    assert rows(run) == rows(straight)


@pytest.mark.slow
def test_resume_says_what_it_loaded_and_keeps_the_precision_the_run_trained_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 23's follow-up: ``auto`` resolved to bf16 where the run started (a native-bf16 CPU); a
    ``--resume`` on a CPU without native bf16 (where ``auto`` is fp32) keeps bf16 autocast, which runs
    on any CPU, and says so; the checkpoints record it. ``--resume`` says what it loaded."""
    from bayesncl.core import optim

    args = [*TINY_BASE, "method.name=ncl", "train.epochs=1"]  # auto; 3 steps an epoch
    run = tmp_path / "run"
    monkeypatch.setattr(optim, "native_cpu_bf16", lambda flags=None: "AVX512-BF16")
    pretrain(build_config(overrides=args), run, evaluate=False)
    recorded = {"dtype": "bf16", "channels_last": True}
    assert load_checkpoint_file(run / "last.pt")["precision"] == recorded
    capsys.readouterr()
    monkeypatch.setattr(optim, "native_cpu_bf16", lambda flags=None: None)
    more = [*args[:-1], "train.epochs=2"]
    pretrain(build_config(overrides=more), run, resume=True, evaluate=False)
    out = capsys.readouterr().out
    assert f"resuming {run} from last.pt at epoch 1 (step 3)\n" in out
    assert (
        "precision: bf16 autocast + channels-last (the run's, from its checkpoint: train.precision=auto "
        "chose it where the run started; here it would choose fp32)\n"
    ) in out
    assert load_checkpoint_file(run / "last.pt")["precision"] == recorded

    # a precision this device cannot compute in (fp16 on a CPU): this machine's, and a warning
    ckpt = load_checkpoint_file(run / "last.pt")
    ckpt["precision"] = {"dtype": "fp16", "channels_last": False}
    torch.save(ckpt, run / "last.pt")
    with pytest.warns(UserWarning) as record:
        pretrain(build_config(overrides=[*args[:-1], "train.epochs=3"]), run, resume=True, evaluate=False)
    assert [str(w.message) for w in record] == [
        "--resume: the run trained in fp16 (train.precision=auto where it started), which this cpu cannot "
        "compute in: it continues in fp32"
    ]
    assert "precision: fp32 (train.precision=auto: this CPU has no native bf16" in capsys.readouterr().out
    assert load_checkpoint_file(run / "last.pt")["precision"] == {"dtype": "fp32", "channels_last": False}


@pytest.mark.slow
def test_resume_that_changes_the_length_of_an_unfinished_run_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real, calls = engine_module.contrastive_loss, {"n": 0}

    def ctrl_c_in_step_4(*a: Any, **k: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 4:  # the first step of epoch 2 (3 steps an epoch)
            ctrl_c()
        return real(*a, **k)

    run = tmp_path / "run"
    monkeypatch.setattr(engine_module, "contrastive_loss", ctrl_c_in_step_4)
    with pytest.raises(rundir_module.TrainingInterrupted):
        pretrain(build_config(overrides=[*TINY, "train.epochs=3"]), run, evaluate=False)
    monkeypatch.setattr(engine_module, "contrastive_loss", real)
    with pytest.warns(UserWarning) as record:
        pretrain(build_config(overrides=[*TINY, "train.epochs=2"]), run, resume=True, evaluate=False)
    assert [str(w.message) for w in record] == [
        "--resume with train.epochs=2 changes a 3-epoch run that stopped after epoch 1 (inside the next): "
        "the learning-rate schedule is recomputed for 2 epochs from here, so the result matches neither an "
        "uninterrupted 3- nor 2-epoch run"
    ]
    with warnings.catch_warnings():  # a finished run extended: the documented way, no warning
        warnings.simplefilter("error")
        pretrain(build_config(overrides=[*TINY, "train.epochs=3"]), run, resume=True, evaluate=False)


@pytest.mark.integration
def test_resume_inside_an_epoch_needs_that_epoch(tmp_path: Path) -> None:
    run = tmp_path / "run"
    pretrain(build_config(overrides=[*TINY, "train.epochs=2"]), run, evaluate=False)
    ckpt = load_checkpoint_file(run / "last.pt")
    ckpt.update(epoch=1, partial={"n_seen": 1, "sums": torch.zeros(6), "elapsed": 0.0})
    ckpt["step"] = ckpt["steps_per_epoch"] + 1
    torch.save(ckpt, run / "last.pt")
    code, _, err = run_cli(["pretrain", "--run-dir", str(run), "--resume", "train.epochs=1"])
    assert code == 2 and err.strip() == (
        "bayesncl: error: --resume: train.epochs=1 is fewer than 2: the run stopped inside epoch 2; "
        "give train.epochs >= 2 to continue it"
    )


# ----------------------------------------------------------------------------- resume details
@pytest.mark.slow
def test_resume_with_dataloader_workers_is_bit_identical(tmp_path: Path) -> None:
    """The per-sample path with 2 worker processes: augmentation is seeded per sample, so workers'
    RNGs need no saved state."""
    per_sample = [*TINY, "data.resident=false", "data.num_workers=2"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    pretrain(build_config(overrides=[*per_sample, "train.epochs=2"]), straight, evaluate=False)
    pretrain(build_config(overrides=[*per_sample, "train.epochs=1"]), split, evaluate=False)
    pretrain(build_config(overrides=[*per_sample, "train.epochs=2"]), split, resume=True, evaluate=False)
    assert_same_weights(straight / "last.pt", split / "last.pt")
    a, b = load_checkpoint_file(straight / "last.pt"), load_checkpoint_file(split / "last.pt")
    assert a["step"] == b["step"] == 6 and a["scaler"] == b["scaler"]
    opt_a, opt_b = a["optimizer"]["state"], b["optimizer"]["state"]
    assert opt_a.keys() == opt_b.keys()
    for k in opt_a:
        assert all(torch.equal(v, opt_b[k][n]) for n, v in opt_a[k].items() if torch.is_tensor(v)), k


def test_resume_removes_temporary_files_of_a_killed_save(tmp_path: Path) -> None:
    run = tmp_path / "run"
    pretrain(build_config(overrides=[*TINY, "train.epochs=1"]), run, evaluate=False)
    for name in (".last.pt.tmp4242", ".epoch-0002.pt.tmp4242", ".log.csv.tmp4242"):
        (run / name).write_bytes(b"half a file")
    pretrain(build_config(overrides=[*TINY, "train.epochs=2"]), run, resume=True, evaluate=False)
    assert not [p.name for p in run.iterdir() if p.name.startswith(".")]



@pytest.mark.slow
def test_resume_that_trains_further_archives_the_shorter_runs_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    pretrain(build_config(overrides=[*TINY, "train.epochs=1"]), run, evaluate=False)
    old_encoder = (run / "encoder.safetensors").read_bytes()
    for name in ("evaluation.json", "dynamics.md", "features_test.npz", "top_activations.png"):
        (run / name).write_text(f"1-epoch {name}")
    (run / "notes.txt").write_text("mine")
    capsys.readouterr()
    pretrain(build_config(overrides=[*TINY, "train.epochs=2"]), run, resume=True, evaluate=False)
    archive = run / "results-epoch-0001"
    assert f"moved the results of the 1-epoch run to {archive}/" in capsys.readouterr().out
    assert sorted(p.name for p in archive.iterdir()) == sorted(
        ["dynamics.md", "encoder.safetensors", "evaluation.json",
         "features_test.npz", "top_activations.png", "training_curves.png"]
    )
    assert (archive / "encoder.safetensors").read_bytes() == old_encoder
    assert (archive / "evaluation.json").read_text() == "1-epoch evaluation.json"
    assert not (run / "evaluation.json").exists() and (run / "notes.txt").read_text() == "mine"
    assert (run / "encoder.safetensors").read_bytes() != old_encoder  # the 2-epoch export
    # a resume with nothing left to train moves nothing; --overwrite removes the archive too
    pretrain(build_config(overrides=[*TINY, "train.epochs=2"]), run, resume=True, evaluate=False)
    assert sorted(p.name for p in run.glob("results-epoch-*")) == ["results-epoch-0001"]
    pretrain(build_config(overrides=[*TINY, "train.epochs=1"]), run, overwrite=True, evaluate=False)
    assert not list(run.glob("results-epoch-*")) and (run / "notes.txt").exists()

# ----------------------------------------------------------------------------- non-finite loss
def _nan_at(step: int) -> Any:
    real = engine_module.contrastive_loss
    calls = {"n": 0}

    def loss_fn(out: Any, method: Any, **kwargs: Any) -> Any:
        loss, parts = real(out, method, **kwargs)
        calls["n"] += 1
        if calls["n"] == step:
            nan = torch.tensor(float("nan"))
            return loss * nan, {"info_nce": parts["info_nce"] * nan, "kl": parts["kl"]}
        return loss, parts

    return loss_fn


@pytest.mark.slow
def test_non_finite_loss_stops_naming_step_and_parts_and_keeps_last_good_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    monkeypatch.setattr(engine_module, "contrastive_loss", _nan_at(5))  # 3 steps per epoch: epoch 2
    with pytest.raises(TrainingError) as info:
        pretrain(build_config(overrides=[*TINY, "train.epochs=3"]), run, evaluate=False)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("non-finite loss at step 5 (epoch 2): InfoNCE=nan, KL=")
    assert msg.endswith(f"the last good checkpoint {run / 'last.pt'} is kept")
    ckpt = load_checkpoint_file(run / "last.pt")
    assert ckpt["epoch"] == 1 and ckpt["step"] == 3
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())
    assert [r["epoch"] for r in log_rows(run)] == ["1"]


@pytest.mark.slow
def test_non_finite_weights_with_a_finite_loss_stop_and_keep_the_last_good_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    real, calls = engine_module.train_step, {"n": 0}

    def train_step(step_model: Any, *args: Any, **kwargs: Any) -> Any:
        stats = real(step_model, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 5:  # epoch 2 (3 steps per epoch): a BatchNorm running variance overflows
            bn = next(m for m in step_model.modules() if isinstance(m, torch.nn.BatchNorm2d))
            bn.running_var.fill_(float("inf"))
        return stats

    monkeypatch.setattr(engine_module, "train_step", train_step)
    with pytest.raises(TrainingError) as info:
        pretrain(build_config(overrides=[*TINY, "train.epochs=3"]), run, evaluate=False)
    msg = str(info.value)
    assert re.fullmatch(
        r"non-finite weights after epoch 2 \(step 6\), although the loss stayed finite: "
        r"backbone\.[\w.]+\.running_var holds NaN or inf \(the training diverged: lower "
        rf"train\.base_lr=[\d.e+-]+\); the last good checkpoint {re.escape(str(run / 'last.pt'))} is kept",
        msg,
    ), msg
    ckpt = load_checkpoint_file(run / "last.pt")
    assert ckpt["epoch"] == 1
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())
    assert not (run / "epoch-0002.pt").exists()
    assert [r["epoch"] for r in log_rows(run)] == ["1"]


@pytest.mark.slow
def test_non_finite_loss_from_the_cli_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("kept")
    for run in (tmp_path / "run", tmp_path / "mine"):  # a new dir, and an existing one with a user file
        monkeypatch.setattr(engine_module, "contrastive_loss", _nan_at(2))
        assert main(["pretrain", "--run-dir", str(run), *TINY, "train.epochs=2"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("bayesncl: error: non-finite loss at step 2 (epoch 1): InfoNCE=nan, KL=")
        assert err.endswith("; no epoch had finished, so nothing was kept: fix the cause and rerun")
        assert "\n" not in err
    # nothing was kept: the new run dir is gone, the existing one holds only the user's file again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


# ----------------------------------------------------------------------------- fp16 overflow
@pytest.mark.slow
def test_fp16_overflow_is_skipped_by_the_grad_scaler_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scalers: list[Any] = []

    class CountingScaler(torch.amp.GradScaler):
        """Starts at a scale that overflows fp16 gradients; counts skipped and taken steps."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, init_scale=2.0**30, backoff_factor=2.0**-8, **kwargs)
            self.skipped = self.taken = 0
            scalers.append(self)

        def update(self, new_scale: Any = None) -> None:
            before = self.get_scale()
            super().update(new_scale)
            if self.get_scale() < before:
                self.skipped += 1
            else:
                self.taken += 1

    monkeypatch.setattr(torch.amp, "GradScaler", CountingScaler)
    run = tmp_path / "run"
    pretrain(build_config(overrides=[*TINY, "train.epochs=2", "train.precision=fp16"]), run, evaluate=False)
    (scaler,) = scalers
    assert scaler.is_enabled() and scaler.skipped >= 1 and scaler.taken >= 1
    assert load_checkpoint_file(run / "last.pt")["scaler"]["scale"] == scaler.get_scale()
    rows = log_rows(run)
    assert len(rows) == 2 and all(float(r["loss"]) == float(r["loss"]) for r in rows)  # finite, no NaN


# ----------------------------------------------------------------------------- gate health
@pytest.mark.slow
def test_gate_health_is_logged_per_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    pretrain(build_config(overrides=[*TINY, "train.epochs=2", "method.rho=0.7"]), run, evaluate=False)
    rows = log_rows(run)
    assert len(rows) == 2
    for r in rows:
        assert 0.0 < float(r["gate_open"]) < 1.0 and float(r["rho"]) == 0.7
        assert 0.0 <= float(r["rows_all_closed"]) <= 0.5
    assert "gate collapse" not in capsys.readouterr().out
    ncl = tmp_path / "ncl"
    monkeypatch.setattr(engine_module, "STEP_LOG_EVERY", 3)  # a steps.csv row at the epoch's end
    pretrain(build_config(overrides=[*TINY, "train.epochs=1", "method.name=ncl"]), ncl, evaluate=False)
    (r,) = log_rows(ncl)  # a run without a gate logs none of the gate's statistics: no column
    assert not {"kl", "gate_open", "rho", "gate_mean_alpha", "rows_all_closed"} & set(r)
    assert float(r["info_nce"]) > 0
    (s,) = list(csv.DictReader((ncl / "steps.csv").open()))
    assert not {"kl", "gate_open", "gate_mean_alpha"} & set(s) and float(s["info_nce"]) > 0


@pytest.mark.slow
def test_gate_collapse_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = train_module.build_model

    def closed_gates(*args: Any, **kwargs: Any) -> Any:
        model = real(*args, **kwargs)
        last = model.gating_head.net[-1]
        with torch.no_grad():
            last.weight.zero_()
            last.bias.fill_(-30.0)  # alpha = sigmoid(-30): every gate closed
        return model

    monkeypatch.setattr(train_module, "build_model", closed_gates)
    run = tmp_path / "run"
    pretrain(build_config(overrides=[*TINY, "train.epochs=1"]), run, evaluate=False)
    (r,) = log_rows(run)
    assert float(r["gate_open"]) == 0.0 and float(r["rows_all_closed"]) == 1.0
    assert "warning: gate collapse: 100% of rows have every gate closed" in capsys.readouterr().out


@pytest.mark.slow
def test_ctrl_c_during_the_final_evaluation_says_training_is_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import bayesncl.app.evaluate as pipeline

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "evaluate_model", interrupted)
    run = tmp_path / "run"
    assert main(["pretrain", "--run-dir", str(run), *TINY, "train.epochs=1"]) == 130
    assert capsys.readouterr().err.strip() == (
        f"bayesncl: interrupted: stopped during the end-of-training evaluation; training is complete "
        f"({run / 'last.pt'}): `bayesncl evaluate {run}` evaluates it"
    )
    assert load_checkpoint_file(run / "last.pt")["epoch"] == 1 and (run / "encoder.safetensors").exists()


# ----------------------------------------------------------------------------- signals at the edges
@pytest.mark.slow
def test_a_stop_after_an_epochs_last_step_resumes_bit_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [*TINY, "train.epochs=2", "--no-eval"]  # 3 steps per epoch
    assert main(["pretrain", "--run-dir", str(tmp_path / "straight"), *args]) == 0
    with monkeypatch.context() as m:
        signal_at(m, engine_module, "train_step", (3,))  # the last step of epoch 1
        assert main(["pretrain", "--run-dir", str(tmp_path / "run"), *args]) == 130
    assert "stopped in epoch 1 after 3 of its 3 steps" in capsys.readouterr().err
    assert main(["pretrain", "--run-dir", str(tmp_path / "run"), "--resume"]) == 0
    assert_same_weights(tmp_path / "straight" / "last.pt", tmp_path / "run" / "last.pt")
    def rows(run: Path) -> list[dict[str, str]]:
        return [{k: v for k, v in r.items() if k != "epoch_time_s"} for r in log_rows(run)]

    assert rows(tmp_path / "run") == rows(tmp_path / "straight")


@pytest.mark.slow
def test_a_signal_during_the_last_epochs_saves_stops_before_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    with monkeypatch.context() as m:
        signal_at(m, rundir_module, "write_log", (1,))  # epoch 1 of 1: the checkpoint, then the log
        assert main(["pretrain", "--run-dir", str(run), *TINY, "train.epochs=1"]) == 130
    assert capsys.readouterr().err.strip() == (
        f"bayesncl: interrupted: stopped after the last epoch (1), before the export and evaluation; "
        f"{run / 'last.pt'} holds the trained model: --resume exports and evaluates it"
    )
    assert not (run / "encoder.safetensors").exists() and not (run / "metrics.json").exists()
    assert main(["pretrain", "--run-dir", str(run), "--resume"]) == 0
    assert (run / "encoder.safetensors").exists() and (run / "metrics.json").exists()


@pytest.mark.slow
def test_a_hard_stop_in_epoch_1_leaves_a_dir_the_same_command_can_reuse(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    run = tmp_path / "run"
    args = ["pretrain", "--run-dir", str(run), *TINY, "train.epochs=1", "--no-eval"]
    # Python's own Ctrl-C handler, as in a terminal (a shell's background job starts with SIGINT ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    with monkeypatch.context() as m:
        signal_at(m, engine_module, "train_step", (2, 2))  # a second Ctrl-C stops at once: no checkpoint
        assert main(args) == 130
    assert capsys.readouterr().err.strip() == "bayesncl: interrupted"
    assert not run.exists()
    run.mkdir()  # as a SIGKILL in epoch 1 leaves it: config.yaml only
    (run / "config.yaml").write_text("seed: 0\n")
    assert main([*args[:3], "--resume"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"bayesncl: error: --resume: no checkpoint {run / 'last.pt'} to resume from (the run stopped "
        "before its first checkpoint: run the same command without --resume)"
    )
    assert main(args) == 0 and load_checkpoint_file(run / "last.pt")["epoch"] == 1


@pytest.mark.slow
def test_resume_restores_a_periodic_checkpoint_a_kill_prevented(tmp_path: Path) -> None:
    """last.pt is written before epoch-NNNN.pt: a SIGKILL between the two leaves the periodic copy
    missing (as here, removed by hand); --resume writes it from last.pt, so `dynamics` misses no epoch."""
    run = tmp_path / "run"
    pretrain(build_config(overrides=[*TINY, "train.epochs=2"]), run, evaluate=False)
    last = (run / "last.pt").read_bytes()
    (run / "epoch-0002.pt").unlink()
    pretrain(build_config(overrides=[*TINY, "train.epochs=3"]), run, resume=True, evaluate=False)
    assert (run / "epoch-0002.pt").read_bytes() == last
    assert sorted(p.name for p in run.glob("epoch-*.pt")) == [f"epoch-000{e}.pt" for e in (1, 2, 3)]


@pytest.mark.slow
def test_overwrite_keeps_the_old_run_until_the_new_one_has_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    args = ["pretrain", "--run-dir", str(run), *TINY, "train.epochs=1"]
    assert main(args) == 0
    (run / "notes.txt").write_text("mine")
    (run / "eval-epoch-0001").mkdir()  # what `evaluate RUN/epoch-0001.pt` writes: the old run's too
    (run / "eval-epoch-0001" / "evaluation.json").write_text("{}")

    def files() -> dict[str, bytes]:
        return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*") if p.is_file()}

    before = files()
    monkeypatch.setattr(engine_module, "contrastive_loss", _nan_at(2))  # the new run fails in epoch 1
    assert main([*args, "--overwrite"]) == 2
    assert "non-finite loss at step 2 (epoch 1)" in capsys.readouterr().err
    assert files() == before  # the old run is back, whole
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == ["eval-epoch-0001"]
    monkeypatch.undo()
    assert main([*args, "train.epochs=2", "--overwrite"]) == 0  # a new run that succeeds replaces it
    assert load_checkpoint_file(run / "last.pt")["epoch"] == 2
    assert not [p for p in run.iterdir() if p.name.startswith(".")] and (run / "notes.txt").exists()
    assert not (run / "eval-epoch-0001").exists()  # the old run's evaluation went with it


@pytest.mark.integration
@pytest.mark.slow
def test_a_killed_overwrite_is_finished_by_the_next_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGKILL during an --overwrite's first epoch (the previous run waits in .replaced-PID/): the
    next command on the run dir puts the previous run back, whole, before anything else."""
    run = tmp_path / "run"
    args = ["pretrain", "--run-dir", str(run), *TINY, "data.train_subset=192", "--no-eval"]
    assert main([*args, "train.epochs=1"]) == 0
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    proc = start_cli([*args, "train.epochs=2", "--overwrite"], delay=0.2)
    wait_for(lambda: bool(list(run.glob(".replaced-*"))) and (run / "config.yaml").exists(), proc)
    time.sleep(0.3)  # inside epoch 1 of the new run, before its first checkpoint
    proc.kill()
    proc.communicate()
    assert not (run / "last.pt").exists() and list(run.glob(".replaced-*/last.pt"))
    capsys.readouterr()
    assert main([*args, "train.epochs=1"]) == 2  # the run dir holds the previous run again
    out, err = capsys.readouterr()
    assert f"put the previous run back in {run}" in out and "already holds a run" in err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_reading_commands_point_to_the_run_a_killed_overwrite_set_aside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """evaluate, extract, curves and dynamics only read: on a run dir whose previous run waits in a
    killed --overwrite's .replaced-PID/ they said 'not a run dir', as if it were lost."""
    run = tmp_path / "run"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for pid in (os.getpid(), dead.pid):  # an --overwrite under way (this process): no hint
        aside = run / f".replaced-{pid}"
        aside.mkdir(parents=True)
        for name in ("last.pt", "log.csv", "epoch-0001.pt", ".complete"):
            (aside / name).write_bytes(b"the previous run")
        hint = (
            f" (an --overwrite that was killed left the previous run in {aside}/: `bayesncl pretrain "
            f"--run-dir {run} --resume` puts it back)"
        ) if pid == dead.pid else ""
        for cmd, message in (
            ("evaluate", f"{run} holds no last.pt: not a bayesncl run dir (or pass a checkpoint file)"),
            ("extract", f"{run} holds no last.pt: not a bayesncl run dir (or pass a checkpoint file)"),
            ("curves", f"{run} has no log.csv: expected a run dir (or its log.csv) with at least one "
                       "finished epoch"),
            ("dynamics", f"{run} holds no periodic checkpoints epoch-NNNN.pt (train.checkpoint_every > 0)"),
        ):
            capsys.readouterr()
            assert main([cmd, str(run)]) == 2
            assert capsys.readouterr().err == f"bayesncl: error: {message}{hint}\n"
        if pid == os.getpid():
            (aside / ".complete").unlink()
            for p in aside.iterdir():
                p.unlink()
            aside.rmdir()
    assert sorted(p.name for p in run.iterdir()) == [f".replaced-{dead.pid}"]  # nothing was moved


def test_a_killed_overwrite_that_had_a_checkpoint_keeps_the_new_run(tmp_path: Path) -> None:
    """Killed between the new run's first last.pt and the deletion of the previous run: the new run
    stays, the previous one goes (as the overwrite would have done); a live process's folder stays."""
    from bayesncl.runs.lock import recover_interrupted_overwrite

    run = tmp_path / "run"
    run.mkdir()
    (run / "last.pt").write_bytes(b"the new run")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    aside, live = run / f".replaced-{dead.pid}", run / f".replaced-{os.getpid()}"
    for folder in (aside, live):
        folder.mkdir()
        (folder / "last.pt").write_bytes(b"the previous run")
        (folder / ".complete").touch()  # the set-aside had finished
    assert recover_interrupted_overwrite(run) == [
        f"an interrupted --overwrite (process {dead.pid}) had set the previous run aside: its new run "
        "has a checkpoint, so the previous one was deleted"
    ]
    assert not aside.exists() and (live / "last.pt").exists()
    assert (run / "last.pt").read_bytes() == b"the new run"


@pytest.mark.slow
def test_resume_after_a_killed_overwrite_and_a_cut_short_set_aside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--resume reads the run's config only after the previous run is back; a set-aside that was
    itself cut short (no .complete marker) is put back, never taken for a finished overwrite."""
    from bayesncl.runs.lock import recover_interrupted_overwrite, set_aside_run_artifacts

    run = tmp_path / "run"
    args = ["pretrain", "--run-dir", str(run), *TINY, "--no-eval"]
    assert main([*args, "train.epochs=1"]) == 0
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    aside = set_aside_run_artifacts(run)  # an --overwrite with method.name=ncl, killed in its epoch 1
    assert aside is not None
    aside.rename(run / ".replaced-999999999")
    (run / "config.yaml").write_text("method:\n  name: ncl\n")
    capsys.readouterr()
    assert main(["pretrain", "--run-dir", str(run), "--resume", "train.epochs=2"]) == 0
    assert f"put the previous run back in {run}" in capsys.readouterr().out
    assert load_checkpoint_file(run / "last.pt")["epoch"] == 2

    # cut short: config.yaml and log.csv moved, last.pt not yet, no marker: the old run goes back whole
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    cut = run / ".replaced-999999999"
    cut.mkdir()
    for name in ("config.yaml", "log.csv"):
        (run / name).rename(cut / name)
    assert recover_interrupted_overwrite(run, owner_gone=True) == [
        "an interrupted --overwrite (process 999999999) had set the previous run aside: put the previous "
        f"run back in {run}"
    ]
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert not list(run.glob(".replaced-*"))


@pytest.mark.slow
def test_a_log_whose_header_is_not_the_runs_is_rewritten_under_the_runs_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--resume keeps a log's header only where it holds the run's columns: a log.csv edited by hand
    (no ``lr``: no row could be written under it) or a steps.csv cut to other columns is rewritten,
    every row from the checkpoint, under the run's own columns (it was a traceback: 'lr' is not in
    list)."""
    monkeypatch.setattr(engine_module, "STEP_LOG_EVERY", 2)  # steps.csv rows in 3-step epochs
    run = tmp_path / "run"
    pretrain(build_config(overrides=[*TINY, "train.epochs=1"]), run, evaluate=False)
    own = {name: (run / name).read_text().splitlines()[0] for name in ("log.csv", "steps.csv")}
    (run / "log.csv").write_text("epoch,step,loss\n1,3,2.7\n")
    (run / "steps.csv").write_text("step,epoch,loss,mine,lr\n")
    assert main(["pretrain", "--run-dir", str(run), "--resume", "train.epochs=2", "--no-eval"]) == 0
    with (run / "log.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["epoch"] for r in rows] == ["1", "2"] and all(float(r["lr"]) >= 0 for r in rows)
    assert (run / "log.csv").read_text().splitlines()[0] == own["log.csv"]
    assert (run / "steps.csv").read_text().splitlines()[0] == own["steps.csv"]
    # a header with every column of the run's, and more, is kept (an older log's empty gate columns)
    from bayesncl.runs.logs import resumed_header

    assert resumed_header(run / "log.csv", ("epoch", "lr")) == tuple(own["log.csv"].split(","))
    assert resumed_header(tmp_path / "none.csv", ("epoch", "lr")) == ("epoch", "lr")


def test_resume_without_config_yaml_reads_the_checkpoints_config(tmp_path: Path) -> None:
    run = tmp_path / "run"
    pretrain(build_config(overrides=[*TINY, "train.epochs=1"]), run, evaluate=False)
    (run / "config.yaml").unlink()  # deleted by hand; last.pt holds the config too
    assert main(["pretrain", "--run-dir", str(run), "--resume", "train.epochs=2", "--no-eval"]) == 0
    assert load_checkpoint_file(run / "last.pt")["epoch"] == 2 and (run / "config.yaml").exists()


@pytest.mark.slow
def test_a_run_logged_with_every_column_resumes_with_its_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run logged before a run's columns were its own statistics (issue 45: an ungated run's log.csv
    and steps.csv then had the gate's columns, empty) and stopped inside epoch 2 keeps its files'
    headers when --resume continues it: its new rows fill the columns it logs, the gate's stay
    empty, and numbers and weights are those of a straight run (whose files have its own columns)."""
    from bayesncl.app.report.curves import read_log, training_curves_figure
    from bayesncl.runs.logs import LOG_FIELDS, STEP_LOG_FIELDS, write_log

    args = [*TINY_BASE, "method.name=ncl", "train.precision=fp32", "train.epochs=2"]
    straight, run = _straight_and_stopped_in_epoch_2(tmp_path, monkeypatch, args)
    for name, fields in (("log.csv", LOG_FIELDS), ("steps.csv", STEP_LOG_FIELDS)):  # as the code before wrote
        with (run / name).open() as f:
            write_log(run, list(csv.DictReader(f)), name, fields)
    pretrain(build_config(overrides=args), run, resume=True, evaluate=False)
    assert_same_weights(straight / "last.pt", run / "last.pt")
    for name, fields in (("log.csv", LOG_FIELDS), ("steps.csv", STEP_LOG_FIELDS)):
        with (run / name).open() as f, (straight / name).open() as g:
            old, new = csv.DictReader(f), csv.DictReader(g)
            assert old.fieldnames == fields and not {"kl", "gate_open"} & set(new.fieldnames or [])
            pairs = list(zip(old, new, strict=True))
        assert len(pairs) == (2 if name == "log.csv" else 3)
        for a, b in pairs:
            assert a["kl"] == a["gate_open"] == "" and float(a["info_nce"]) > 0
            assert {k: v for k, v in a.items() if k in b and k != "epoch_time_s"} == {
                k: v for k, v in b.items() if k != "epoch_time_s"
            }
    fig = training_curves_figure({"old": read_log(run), "new": read_log(straight)})  # both still draw
    assert [ax.get_title() for ax in fig.axes][:2] == ["InfoNCE (nats)", "online probe accuracy (%)"]
    assert not any("KL" in ax.get_title() or "gate" in ax.get_title() for ax in fig.axes)


@pytest.mark.slow
def test_a_run_without_labels_logged_with_an_empty_probe_column_resumes_with_its_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run without labels (data.labels=none) logs no online_acc; one logged before that, its
    online_acc column empty, and stopped inside epoch 2 keeps its files' headers on --resume: the
    column stays, empty; the other cells and the weights are those of a straight run (no column)."""
    from bayesncl.core import methods
    from bayesncl.runs.logs import heldout_fields, log_columns, write_log

    args = [*TINY_BASE, "method.name=ncl", "train.precision=fp32", "train.epochs=2", "data.labels=none"]
    straight, run = _straight_and_stopped_in_epoch_2(tmp_path, monkeypatch, args)
    labelled_run = methods.get("ncl").logged(build_config(overrides=args).method)  # with online_acc
    before = log_columns(labelled_run, heldout_fields(False))
    old = {"log.csv": list(before.epoch), "steps.csv": list(before.step)}  # as the code before wrote them
    assert "online_acc" in old["log.csv"] and "online_acc" in old["steps.csv"]
    for name, fields in old.items():
        with (run / name).open() as f:
            write_log(run, list(csv.DictReader(f)), name, fields)
    pretrain(build_config(overrides=args), run, resume=True, evaluate=False)
    assert_same_weights(straight / "last.pt", run / "last.pt")
    for name, fields in old.items():
        with (run / name).open() as f, (straight / name).open() as g:
            kept, new = csv.DictReader(f), csv.DictReader(g)
            assert kept.fieldnames == fields and "online_acc" not in (new.fieldnames or [])
            pairs = list(zip(kept, new, strict=True))
        assert len(pairs) == (2 if name == "log.csv" else 3)
        for a, b in pairs:
            assert a["online_acc"] == "" and float(a["info_nce"]) > 0
            assert {k: v for k, v in a.items() if k != "online_acc" and k != "epoch_time_s"} == {
                k: v for k, v in b.items() if k != "epoch_time_s"
            }


def _straight_and_stopped_in_epoch_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> tuple[Path, Path]:
    """A 2-epoch run trained straight, and the same run stopped at step 5 (inside epoch 2), both
    logging every 2 steps: ``(straight, run)``."""
    monkeypatch.setattr(engine_module, "STEP_LOG_EVERY", 2)
    straight, run = tmp_path / "straight", tmp_path / "run"
    pretrain(build_config(overrides=args), straight, evaluate=False)
    with monkeypatch.context() as m:
        signal_at(m, engine_module, "train_step", (5,))  # inside epoch 2
        with pytest.raises(rundir_module.TrainingInterrupted, match="stopped in epoch 2"):
            pretrain(build_config(overrides=args), run, evaluate=False)
    return straight, run
