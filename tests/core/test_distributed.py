"""Data-parallel training: 2 gloo processes on CPU against 1 process over the concatenated batch,
the torchrun end-to-end run, and the one-line errors for impossible launches.

Known bugs in this field that these tests guard against (STYLE.md): negatives from the local rank
only (solo-learn #229, lightly #1176), a wrong positive-pair mask on ranks > 0 (solo-learn #206)
and a gradient off by 1/world_size from a reduction without autograd (lightly #1920, #1977).
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from bayesncl.app.cli import main
from bayesncl.config import build_config
from bayesncl.core import distributed
from bayesncl.core.engine import TrainForward, forward_loss, wrap_for_training
from bayesncl.core.model import ContrastiveModel, build_model, contrastive_loss
from bayesncl.runs.fileio import DiskFullError

from ..conftest import GLOO_TIMEOUT, gloo_group, spawn

METHODS = ("cl", "ncl", "bayesncl", "cl-l1", "scl", "ncl-supcon", "nce")  # the last four: issue 25
WORLD = 2
GLOBAL_BATCH = 8  # images (16 views); 4 per process
TINY_MODEL = [
    "model.backbone=small_cnn",
    "model.proj_hidden=32",
    "model.proj_dim=16",
    "method.lam=0.05",  # a KL term large enough to matter in the gradient
    "train.device=cpu",
]


# ----------------------------------------------------------------------------- shared set-up
def _model(method: str) -> tuple[Any, ContrastiveModel]:
    """Identical initial weights in every process (seeded); BatchNorm in eval mode, see below."""
    cfg = build_config(overrides=[*TINY_MODEL, f"method.name={method}"])
    torch.manual_seed(0)
    model = build_model(cfg, 3, 16, 10)
    model.train()
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.eval()  # per-process batch statistics differ from the global batch's (no SyncBN on CPU)
    return cfg, model


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x1 = torch.randn(GLOBAL_BATCH, 3, 16, 16, generator=g)
    x2 = torch.randn(GLOBAL_BATCH, 3, 16, 16, generator=g)
    y = torch.randint(0, 10, (GLOBAL_BATCH,), generator=g)
    return x1, x2, y


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _ddp_worker(rank: int, out: str) -> None:
    """One of WORLD gloo processes: the real train.py step (TrainForward in DDP, forward_loss)
    on this rank's quarter of the global batch, backward, then report loss and gradients."""
    torch.set_num_threads(1)
    with gloo_group(rank, WORLD, Path(out) / "store"):
        world = distributed.setup("cpu")
        assert (world.rank, world.world_size, world.owns_group) == (rank, WORLD, False)
        n = distributed.split_batch(GLOBAL_BATCH, WORLD)
        x1, x2, y = (t[rank * n : (rank + 1) * n] for t in _batch())
        report: dict[str, Any] = {}
        for method in METHODS:
            cfg, model = _model(method)
            step_model = wrap_for_training(model, cfg, world)
            loss, stats = forward_loss(step_model, x1, x2, y, cfg.method)
            loss.backward()
            report[method] = {
                "loss": distributed.all_reduce_mean(loss.detach()),
                "stats": distributed.all_reduce_mean(stats),
                "grads": _grads(model),
            }
        # the known bug, for contrast: InfoNCE with this rank's negatives only
        cfg, model = _model("ncl")
        loss, _ = contrastive_loss(model(torch.cat([x1, x2])), cfg.method, gather=False)
        loss.backward()
        grads = _grads(model)
        for g in grads.values():  # what DDP would do: average over ranks
            dist.all_reduce(g)
            g /= WORLD
        report["ncl-local-negatives"] = {"loss": distributed.all_reduce_mean(loss.detach()), "grads": grads}
        torch.save(report, Path(out) / f"rank{rank}.pt")


def _single_process(method: str, *, gather: bool = True) -> dict[str, Any]:
    cfg, model = _model(method)
    x1, x2, y = _batch()
    loss, stats = forward_loss(TrainForward(model), x1, x2, y, cfg.method)
    loss.backward()
    return {"loss": loss.detach(), "stats": stats, "grads": _grads(model)}


@pytest.fixture(scope="module")
def ddp_reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("ddp")
    spawn(_ddp_worker, (str(out),), nprocs=WORLD, timeout=GLOO_TIMEOUT + 60, what="write rank<r>.pt")
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


# ----------------------------------------------------------------------------- gradient equivalence
@pytest.mark.integration
@pytest.mark.parametrize("method", METHODS)
def test_two_gloo_processes_match_one_process_over_the_concatenated_batch(
    ddp_reports: list[dict[str, Any]], method: str
) -> None:
    """Same loss and same parameter gradients (atol 1e-6) as one process on all 8 images.

    The backbone's BatchNorm layers are in eval mode in both runs: in train mode each process
    normalises with its own 4-image statistics, which differ from the 8-image statistics by
    design (SyncBatchNorm, CUDA only, is what aligns them; see docs/scaling.md). Everything
    else -- gathered negatives with gradient, the positive mask on rank 1, the KL and probe
    means, DDP's 1/world_size average -- is exercised as in training.
    """
    ref = _single_process(method)
    for rank, report in enumerate(ddp_reports):
        got = report[method]
        torch.testing.assert_close(got["loss"], ref["loss"], atol=1e-6, rtol=0)
        # loss, InfoNCE, KL, gate-open rate, closed rows, probe accuracy: global means
        torch.testing.assert_close(got["stats"], ref["stats"], atol=1e-6, rtol=0)
        assert got["grads"].keys() == ref["grads"].keys(), rank
        for name, g in ref["grads"].items():
            torch.testing.assert_close(got["grads"][name], g, atol=1e-6, rtol=0, msg=f"rank {rank}: {name}")
    if method == "bayesncl":
        assert ref["stats"]["kl"] > 0 and any(k.startswith("gating_head.") for k in ref["grads"])


@pytest.mark.integration
def test_local_negatives_alone_do_not_match(ddp_reports: list[dict[str, Any]]) -> None:
    """The test above can fail: without the gather the loss and gradients differ (solo-learn #229)."""
    ref = _single_process("ncl")
    got = ddp_reports[0]["ncl-local-negatives"]
    assert abs(float(got["loss"]) - float(ref["loss"])) > 1e-3
    worst = max(float((g - ref["grads"][k]).abs().max()) for k, g in got["grads"].items())
    assert worst > 1e-4


# ----------------------------------------------------------------------------- rules and errors
def test_lr_scales_with_the_global_batch() -> None:
    assert distributed.scaled_lr(0.4, 256) == pytest.approx(0.4)
    assert distributed.scaled_lr(0.4, 256 * 4) == pytest.approx(1.6)  # batch 256 per process, 4 processes


def test_every_rank_gets_its_own_seed_and_rank0_keeps_the_run_seed() -> None:
    seeds = [distributed.rank_seed(7, r) for r in range(8)]
    assert seeds[0] == 7 and len(set(seeds)) == 8
    assert distributed.rank_seed(7, 1) != distributed.rank_seed(8, 1)


def test_a_batch_that_does_not_split_is_a_clear_error() -> None:
    assert distributed.split_batch(512, 4) == 128
    with pytest.raises(distributed.DistributedError, match="not divisible by 4 processes"):
        distributed.split_batch(510, 4)
    with pytest.raises(distributed.DistributedError, match="need >= 2"):
        distributed.split_batch(4, 4)


def test_sync_bn_on_cpu_processes_is_a_clear_error() -> None:
    world = distributed.World(rank=0, world_size=2, device=torch.device("cpu"))
    with pytest.raises(distributed.DistributedError, match="SyncBatchNorm runs on CUDA only"):
        distributed.check_sync_bn(True, world)
    distributed.check_sync_bn(False, world)
    distributed.check_sync_bn(True, distributed.World())  # one process: plain BatchNorm, no-op
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    assert distributed.convert_sync_bn(model, True, distributed.World()) is model


def _torchrun_env(monkeypatch: pytest.MonkeyPatch, world: int, local_world: int) -> None:
    for k, v in {"RANK": 0, "WORLD_SIZE": world, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": local_world}.items():
        monkeypatch.setenv(k, str(v))


def test_more_processes_than_gpus_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _torchrun_env(monkeypatch, world=4, local_world=4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(distributed.DistributedError, match="4 processes on this node but only 2 CUDA"):
        distributed.setup("cuda")
    with pytest.raises(distributed.DistributedError, match="pins every process to one GPU"):
        distributed.setup("cuda:1")
    run = tmp_path / "run"
    assert main(["pretrain", "--run-dir", str(run), "data.name=synthetic", "train.device=auto"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bayesncl: error:") and "\n" not in err and "--nproc_per_node=2" in err
    assert not run.exists()


def test_cuda_under_torchrun_without_cuda_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    _torchrun_env(monkeypatch, world=2, local_world=2)
    with pytest.raises(distributed.DistributedError, match="no CUDA device is available"):
        distributed.setup("cuda")


def test_malformed_torchrun_environment_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(distributed.DistributedError, match="RANK is not set"):
        distributed.setup("cpu")
    monkeypatch.setenv("RANK", "two")
    with pytest.raises(distributed.DistributedError, match="RANK='two'"):
        distributed.setup("cpu")


def test_single_process_helpers_are_no_ops() -> None:
    world = distributed.setup("cpu")
    assert (world.rank, world.world_size, world.is_main, world.distributed) == (0, 1, True, False)
    x = torch.randn(4, 3, requires_grad=True)
    assert distributed.gather_with_grad(x) is x
    assert distributed.all_reduce_mean(x) is x
    assert distributed.run_on_main(lambda: 5) == 5
    assert distributed.is_main_process() and not distributed.is_distributed()


# ----------------------------------------------------------------------------- torchrun end to end
# 2 processes x batch 16 on 96 images: 3 steps per epoch, 2 epochs
TORCHRUN_TINY = [
    "data.name=synthetic", "data.train_subset=96", "data.test_subset=60", "data.image_size=16",
    "model.backbone=small_cnn", "model.proj_hidden=32", "model.proj_dim=16", "method.lam=0.01",
    "train.epochs=2", "train.batch_size=16", "train.warmup_epochs=1", "train.device=cpu",
]  # fmt: skip
_AUDIT_HOOK = textwrap.dedent(
    """
    # Test-only: record every file write below BAYESNCL_AUDIT_WATCH, per torchrun rank.
    import os, sys
    _out, _watch, _rank = (os.environ.get(k) for k in ("BAYESNCL_AUDIT_OUT", "BAYESNCL_AUDIT_WATCH", "RANK"))
    if _out and _watch and _rank is not None:
        _log = open(os.path.join(_out, "rank" + _rank + ".txt"), "a", buffering=1)
        _WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

        def _under(p):
            try:
                return os.path.abspath(os.fsdecode(p)).startswith(_watch)
            except TypeError:
                return False

        def _hook(event, args):
            if event == "open" and _under(args[0]):
                mode, flags = args[1], args[2]
                if (mode and any(c in mode for c in "wax+")) or (not mode and flags & _WRITE):
                    _log.write("open " + os.fsdecode(args[0]) + "\\n")
            elif event in ("os.rename", "os.mkdir", "os.remove", "os.rmdir") and _under(args[0]):
                _log.write(event + " " + os.fsdecode(args[0]) + "\\n")

        sys.addaudithook(_hook)
    """
)


@pytest.mark.integration
@pytest.mark.slow
def test_torchrun_two_processes_end_to_end(tmp_path: Path) -> None:
    """``python -m torch.distributed.run --nproc_per_node=2 -m bayesncl pretrain`` on tiny
    synthetic data: the run finishes, the run dir is complete, and only rank 0 wrote to it or
    printed progress."""
    run = tmp_path / "run"
    site = tmp_path / "site"
    audit = tmp_path / "audit"
    site.mkdir()
    audit.mkdir()
    (site / "sitecustomize.py").write_text(_AUDIT_HOOK)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "BAYESNCL_AUDIT_OUT": str(audit),
        "BAYESNCL_AUDIT_WATCH": str(run.resolve()),
        "OMP_NUM_THREADS": "1",
    }
    overrides = [*TORCHRUN_TINY, "method.name=bayesncl", "train.progress=true", "eval.batch_size=64"]
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "--tee", "3", "--log-line-prefix-template", "[rank${rank}]: ",
        "-m", "bayesncl", "pretrain", "--run-dir", str(run), *overrides,
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    for name in ("config.yaml", "log.csv", "last.pt", "encoder.safetensors", "metrics.json", "metrics.md"):
        assert (run / name).exists(), name
    rows = (run / "log.csv").read_text().strip().splitlines()
    assert len(rows) == 3  # header + 2 epochs
    ckpt = torch.load(run / "last.pt", weights_only=True)
    assert ckpt["step"] == 2 * (96 // 2 // 16)  # 48 images per rank, batch 16 per rank: 3 steps/epoch

    writes = {r: (audit / f"rank{r}.txt").read_text().splitlines() for r in range(2)}
    assert any("last.pt" in w for w in writes[0]), writes[0]
    assert writes[1] == [], writes[1]

    def lines(stream: str, rank: int) -> list[str]:
        return [ln for ln in stream.splitlines() if ln.startswith(f"[rank{rank}]: ")]

    assert any("semantic" in ln.lower() or "SC" in ln for ln in lines(proc.stdout, 0))  # the table
    assert any(re.search(r"epoch \d/2", ln) for ln in lines(proc.stderr, 0))  # tqdm progress
    assert any("run dir:" in ln for ln in lines(proc.stdout, 0))
    assert lines(proc.stdout, 1) == []  # rank 1 prints nothing
    assert not any(re.search(r"epoch \d/2", ln) for ln in lines(proc.stderr, 1))


@pytest.mark.integration
def test_torchrun_bad_input_is_one_line_from_rank0(tmp_path: Path) -> None:
    """Every process meets a bad value or an occupied run dir alike: the message is printed once,
    whole (it was printed by both ranks, the two lines sometimes run together on one line)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.csv").write_text("epoch\n1\n")  # a run dir that holds a run
    for extra, message in (
        (["method.rho=2"], "method.rho=2.0: expected 0 < rho < 1"),
        ([], f"run dir {run} already holds a run; pass --resume to continue it, --overwrite to replace it, "
             "or choose another --run-dir"),
    ):
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "-m", "bayesncl", "pretrain", "--run-dir", str(run), *TORCHRUN_TINY, *extra,
        ]  # fmt: skip
        proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                              timeout=180)
        assert proc.returncode != 0
        errors = [ln for ln in proc.stderr.splitlines() if "bayesncl: error" in ln]
        assert errors == [f"bayesncl: error: {message}"], proc.stderr[-3000:]
    assert sorted(p.name for p in run.iterdir()) == ["log.csv"]


def _torchrun_pretrain_with_hook(
    tmp_path: Path, hook: str, *overrides: str, one_rank_only: bool = False
) -> tuple[Path, list[str]]:
    """``torchrun --nproc_per_node=2 ... pretrain`` of a tiny run with ``hook`` as every rank's
    sitecustomize; checks that it failed and, unless the error is ``one_rank_only`` (the other rank is
    then left in a collective and torch prints its gloo traceback), that no rank printed a traceback
    of its own (torchrun's own report of the failed processes follows). returns: (run dir, the
    ``bayesncl: error`` lines)."""
    run = tmp_path / "run"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(hook)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "-m", "bayesncl", "pretrain", "--run-dir", str(run), *TORCHRUN_TINY, *overrides,
        "train.progress=false",
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if "bayesncl: error" in ln]
    if not one_rank_only:
        assert not [ln for ln in proc.stderr.splitlines() if ln.startswith("[rank")], proc.stderr[-3000:]
    return run, errors


_RACE_HOOK = textwrap.dedent(
    """
    # Test-only: on rank 0, another command writes a run into the run dir (its log.csv) after
    # pretrain's first run-dir check and just before this one takes the run dir's lock.
    import os
    if os.environ.get("RANK") == "0":
        import bayesncl.runs.lock as _t

        _real = _t.lock_run_dir

        def _lock(run_dir):
            (run_dir / "log.csv").write_text("epoch\\n1\\n")
            return _real(run_dir)

        _t.lock_run_dir = _lock
    """
)


@pytest.mark.integration
def test_torchrun_a_run_written_meanwhile_is_one_line_from_rank0(tmp_path: Path) -> None:
    """A run written into the run dir after the first check (while the data loaded): rank 0's re-check
    under the lock finds it, and every rank stops on that decision. Rank 1 went on alone and ended in a
    gloo traceback (connection closed by rank 0) after rank 0's line."""
    run, errors = _torchrun_pretrain_with_hook(tmp_path, _RACE_HOOK)
    assert errors == [
        f"bayesncl: error: run dir {run} already holds a run; pass --resume to continue it, --overwrite to "
        "replace it, or choose another --run-dir"
    ]
    assert sorted(p.name for p in run.iterdir()) == ["log.csv"]  # the other command's run, untouched
    assert (run / "log.csv").read_text() == "epoch\n1\n"


_DISK_FULL_HOOK = textwrap.dedent(
    """
    # Test-only: on rank 0, the disk fills up while epoch 2's last.pt is saved.
    import os
    if os.environ.get("RANK") == "0":
        import bayesncl.runs.rundir as _t
        from bayesncl.runs.fileio import DiskFullError

        _real = _t.save_checkpoint

        def _save(path, model, optimizer, scaler, state, cfg):
            if path.name == "last.pt" and state.epoch == 2:
                raise DiskFullError(f"{path} cannot be written: no space left on the file system")
            return _real(path, model, optimizer, scaler, state, cfg)

        _t.save_checkpoint = _save
    """
)


@pytest.mark.integration
def test_torchrun_a_full_disk_at_an_epoch_end_is_one_line_from_rank0(tmp_path: Path) -> None:
    """Rank 0 alone saves at an epoch's end; a full disk there stops every rank with its one line. Rank 1
    had gone on into the next epoch and ended in a gloo traceback (connection closed by rank 0)."""
    run, errors = _torchrun_pretrain_with_hook(tmp_path, _DISK_FULL_HOOK, "train.epochs=3")
    full = f"bayesncl: error: {run / 'last.pt'} cannot be written: no space left on the file system"
    assert errors == [full]
    # epoch 1's checkpoint and its log row are kept; no row for the epoch that could not be saved
    assert torch.load(run / "last.pt", map_location="cpu", weights_only=False)["epoch"] == 1
    assert len((run / "log.csv").read_text().strip().splitlines()) == 2  # header + epoch 1


def test_an_error_of_one_rank_names_the_rank(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under torchrun, rank 1 of a node stays quiet about an error every rank meets (its node's rank
    0 prints it), and names itself for one that is its own (here an out-of-memory on its GPU)."""
    import bayesncl.app.cli as cli_module

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    slept: list[float] = []
    monkeypatch.setattr("time.sleep", slept.append)  # (the error layer waits with time.sleep)
    assert main(["pretrain", "method.rho=2"]) == 2
    assert capsys.readouterr().err == "" and slept == [2]

    def oom(args: Any) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has ...")

    def disk_full(args: Any) -> None:  # rank 0 alone writes the run dir: it hands this one to all
        raise DiskFullError("<run>/config.yaml cannot be written: no space left on the file system of <run>")

    monkeypatch.setattr(cli_module, "cmd_pretrain", disk_full)
    assert main(["pretrain"]) == 2
    assert capsys.readouterr().err == "" and slept == [2, 2]

    monkeypatch.setattr(cli_module, "cmd_pretrain", oom)
    assert main(["pretrain"]) == 2
    assert capsys.readouterr().err == (
        "bayesncl: error: (rank 1) out of memory on the GPU (tried to allocate 2.00 GiB): lower "
        "train.batch_size, data.image_size or the model's size (model.backbone, model.proj_dim, "
        "model.proj_hidden, method.gate_hidden)\n"
    )


_CORRUPT_ON_RANK1_HOOK = textwrap.dedent(
    """
    # Test-only: every image folder is checked as it is read (as above VERIFY_MAX_FILES images), and
    # on rank 1 no image can be decoded: a corrupt image in rank 1's shard only.
    import os
    if os.environ.get("RANK") is not None:
        import bayesncl.data.images as _images
        import bayesncl.data.folders as _folders

        _folders.VERIFY_MAX_FILES = 0
        if os.environ["RANK"] == "1":
            def _open_rgb(path):
                raise OSError("cannot identify image file")

            _images._open_rgb = _open_rgb
    """
)


@pytest.mark.integration
@pytest.mark.slow
def test_torchrun_a_corrupt_image_in_one_ranks_shard_is_named(tmp_path: Path) -> None:
    """The DataError of an image found corrupt when read is rank 1's alone: rank 1 prints it (it kept
    quiet, leaving that to its node's rank 0, which never met it: no line said what was wrong)."""
    from PIL import Image

    rng = torch.Generator().manual_seed(0)
    for split, c in itertools.product(("train", "val"), ("cat", "dog")):
        (tmp_path / "folder" / split / c).mkdir(parents=True)
        for i in range(16 if split == "train" else 2):
            pixels = torch.randint(0, 255, (20, 20, 3), generator=rng, dtype=torch.uint8).numpy()
            Image.fromarray(pixels).save(tmp_path / "folder" / split / c / f"{i}.png")
    _, errors = _torchrun_pretrain_with_hook(
        tmp_path, _CORRUPT_ON_RANK1_HOOK, "data.name=imagefolder", f"data.root={tmp_path / 'folder'}",
        "data.resident=false", "data.train_subset=0", "train.batch_size=8", "--no-eval", one_rank_only=True,
    )  # fmt: skip
    assert len(errors) == 1, errors
    assert re.fullmatch(
        rf"bayesncl: error: \(rank 1\) corrupt image {re.escape(str(tmp_path))}/folder/train/\w+/\d+\.png "
        r"\(OSError: cannot identify image file\): fix or remove it, or set data.skip_corrupt=true to skip "
        r"unreadable images",
        errors[0],
    ), errors


_SIGNAL_HOOK = textwrap.dedent(
    """
    # Test-only: rank BAYESNCL_SIGNAL_RANK sends itself BAYESNCL_SIGNAL (SIGINT) after its
    # BAYESNCL_SIGNAL_AT-th training step.
    import os
    _rank = os.environ.get("BAYESNCL_SIGNAL_RANK", "0")
    if os.environ.get("BAYESNCL_SIGNAL_AT") and os.environ.get("RANK") == _rank:
        import signal
        import bayesncl.core.engine as _t

        _real, _n = _t.train_step, [0]

        def _step(*args, **kwargs):
            out = _real(*args, **kwargs)
            _n[0] += 1
            if _n[0] == int(os.environ["BAYESNCL_SIGNAL_AT"]):
                os.kill(os.getpid(), getattr(signal, os.environ.get("BAYESNCL_SIGNAL", "SIGINT")))
            return out

        _t.train_step = _step
    """
)


@pytest.mark.integration
@pytest.mark.slow
def test_torchrun_mid_epoch_stop_and_resume_is_bit_identical_with_random_gates(tmp_path: Path) -> None:
    """2 gloo processes, Gumbel gates (random noise from every rank's global RNG): a SIGTERM to rank 1
    alone in epoch 2 stops both ranks after the same step, each with status 143 (rank 0 too); --resume
    restores each rank's RNG stream, so the weights equal those of an uninterrupted 2-process run."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SIGNAL_HOOK)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "OMP_NUM_THREADS": "1",
    }
    overrides = [*TORCHRUN_TINY, "method.name=bayesncl-gs", "train.progress=false", "--no-eval"]

    signal_env = {"BAYESNCL_SIGNAL_RANK": "1", "BAYESNCL_SIGNAL": "SIGTERM"}

    def torchrun(run: Path, *extra: str, signal_at: str = "") -> subprocess.CompletedProcess[str]:
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "-m", "bayesncl", "pretrain", "--run-dir", str(run), *extra,
        ]  # fmt: skip
        return subprocess.run(
            cmd, env={**env, **signal_env, "BAYESNCL_SIGNAL_AT": signal_at}, capture_output=True, text=True,
            timeout=180,
        )

    straight, run = tmp_path / "straight", tmp_path / "run"
    assert torchrun(straight, *overrides).returncode == 0
    stopped = torchrun(run, *overrides, signal_at="4")  # 3 steps per epoch: step 1 of epoch 2
    assert stopped.returncode != 0
    assert stopped.stderr.count("bayesncl: interrupted: stopped in epoch 2 after 1 of its 3 steps") == 1
    # torchrun's failure summary: each rank exits 143 (rank 0 as if it had received the SIGTERM), unless
    # torchrun, which ends the group once one rank has exited, kills the other first with its own
    # SIGTERM (-15; after the save: both wait for it). Under load either rank can be the first to exit.
    codes = {
        r: re.search(rf"rank\s*: {r} \(local_rank: {r}\)\s*exitcode\s*: (-?\d+)", stopped.stderr)
        for r in (0, 1)
    }
    assert all(m is not None for m in codes.values()), stopped.stderr[-3000:]
    exits = {r: int(m.group(1)) for r, m in codes.items() if m is not None}
    assert set(exits.values()) <= {143, -15} and 143 in exits.values(), exits
    ckpt = torch.load(run / "last.pt", weights_only=True)
    assert ckpt["partial"]["n_seen"] == 1 and len(ckpt["rng_ranks"]) == 2
    resumed = torchrun(run, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = torch.load(straight / "last.pt", weights_only=True)["state_dict"]
    b = torch.load(run / "last.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
