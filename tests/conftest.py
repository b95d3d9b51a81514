"""What the tests share: the repository's paths, tiny CPU settings (synthetic 16 px images, a small
CNN, a few steps per epoch), a tiny untrained checkpoint, small data on disk (an image folder, fake
Fashion-MNIST idx files), seeded generators, the multi-process harness, a CLI run driven from outside
(paced, signalled), the one-line error check, and the messages of docs/bad-inputs.md (:func:`expect`
checks a text against a row's message).

The tests are laid out like the package: ``tests/core``, ``data``, ``metrics``, ``runs``, ``app``,
``paper``, with ``test_config.py`` and ``test_layers.py`` here; data files they read are in
``tests/fixtures``. Test modules import the helpers (``from ..conftest import TINY_BASE``); each adds
its own ``train.epochs`` where it needs another than :data:`TINY`'s one epoch."""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]  # the repository
SRC = ROOT / "src"
RECIPES = SRC / "bayesncl" / "configs"  # the shipped recipes
FIXTURES = ROOT / "tests" / "fixtures"  # data files the tests read (variant_hashes.json)

TINY_BASE = [
    "data.name=synthetic",
    "data.train_subset=96",
    "data.test_subset=60",
    "data.image_size=16",
    "model.backbone=small_cnn",
    "model.proj_hidden=32",
    "model.proj_dim=16",
    "train.batch_size=32",
    "train.warmup_epochs=1",
    "train.progress=false",
    "train.device=cpu",
    "eval.batch_size=64",
    "train.checkpoint_every=1",  # epoch-NNNN.pt every epoch, as `dynamics` and the resume tests expect
]
TINY = [*TINY_BASE, "train.epochs=1"]
ERROR = "bayesncl: error: "


# ----------------------------------------------------------------------------- the default selection
LONG_MARKS = ("slow", "integration")  # deselected unless --run-slow (or -m) asks for them


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow", action="store_true",
        help="also run the tests marked slow (training runs) or integration (other processes, a browser); "
        "by default they are deselected. .ci/run passes it",
    )  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests marked ``slow`` or ``integration`` unless ``--run-slow`` is given or ``-m``
    chooses by marks itself (``-m integration`` runs those); pytest's last line counts them as
    deselected."""
    if config.getoption("--run-slow") or config.option.markexpr:
        return
    long = [item for item in items if any(item.get_closest_marker(m) for m in LONG_MARKS)]
    if long:
        config.hook.pytest_deselected(items=long)
        chosen = set(map(id, long))
        items[:] = [item for item in items if id(item) not in chosen]


@pytest.fixture(autouse=True)
def _close_figures() -> Iterator[None]:
    """Every matplotlib figure a test left open (figure functions return theirs), closed after it:
    past 20 open figures matplotlib warns in whatever test draws the next one, and tests that record
    their warnings (--resume's) failed on it."""
    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


@pytest.fixture(autouse=True)
def _no_umap_panel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedding map without its UMAP panel (umap-learn's first fit in a process compiles numba
    code for about a minute); tests/app/test_embedding.py turns it on where it tests it."""
    from bayesncl.app.report import embedding

    monkeypatch.setattr(embedding, "UMAP_PANEL", False)


@pytest.fixture
def registry() -> Iterator[None]:
    """The method registry as the built-in methods left it, before and after the test (a plugin
    registers its methods for the rest of the process)."""
    from bayesncl.core import methods, plugins

    before, loaded = dict(methods.METHODS), dict(plugins._LOADED)
    yield
    methods.METHODS.clear()
    methods.METHODS.update(before)
    plugins._LOADED.clear()
    plugins._LOADED.update(loaded)


def tiny_checkpoint(path: Path, overrides: list[str], channels: int = 3, num_classes: int = 10) -> Path:
    """A bayesncl checkpoint of an untrained tiny model for ``TINY_BASE + overrides`` (16 px images):
    enough for ``extract`` and ``evaluate``, without training."""
    import torch

    from bayesncl.config import build_config
    from bayesncl.core.model import build_model

    cfg = build_config(overrides=[*TINY_BASE, "train.epochs=1", *overrides])
    model = build_model(cfg, channels, 16, num_classes)
    ckpt = {"format": "bayesncl-checkpoint-v1", "config": cfg.to_dict(), "state_dict": model.state_dict()}
    torch.save(ckpt, path)
    return path


def resumable_checkpoint(path: Path, cfg: Any, epoch: int = 1, partial: bool = False) -> Path:
    """A ``last.pt`` with every entry ``--resume`` checks (no weights, empty states) and ``cfg``'s config,
    stopped after ``epoch`` epochs (``partial``: inside the next one): what the checks of a run to
    continue read, without training."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({
        "format": "bayesncl-checkpoint-v1", "config": cfg.to_dict(), "state_dict": {}, "optimizer": {},
        "scaler": {}, "epoch": epoch, "step": 2 * epoch, "steps_per_epoch": 2, "log": [], "step_log": [],
        "rng": {}, **({"partial": True} if partial else {}),
    }, path)  # fmt: skip
    return path


def image_folder(root: Path, classes: tuple[str, ...] = ("cat", "dog"), n: int = 20) -> Path:
    """An ImageFolder dataset under ``root``: ``n`` random 20 px RGB images per class in train/, 6 in val/."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", n), ("val", 6)):
        for c in classes:
            d = root / split / c
            d.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(d / f"{i}.png")
    return root


# ----------------------------------------------------------------------------- fake Fashion-MNIST on disk
def idx_bytes(arr: np.ndarray) -> bytes:
    """``arr`` as an idx file (uint8): the format of Fashion-MNIST's four files."""
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    return header + arr.astype(np.uint8).tobytes()


def _fmnist_arrays(n: int, seed: int, const: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = (np.arange(n) % 10).astype(np.uint8)
    rng.shuffle(labels)
    if const is not None:
        return np.full((n, 28, 28), const, np.uint8), labels
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    images[:, 0, 0] = labels * 20  # a label fingerprint to check the pairing
    return images, labels


def write_fmnist(d: Path, n_train: int = 60, n_test: int = 20, gz: bool = True, const: int | None = None):
    """The four idx files of random 28 px images (gzipped or raw) in ``d``, for the reader's tests;
    returns ``{split: (images, labels)}``."""
    d.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, prefix, n, seed in (("train", "train", n_train, 1), ("test", "t10k", n_test, 2)):
        images, labels = _fmnist_arrays(n, seed, const)
        for kind, arr in (("images-idx3", images), ("labels-idx1", labels)):
            name = f"{prefix}-{kind}-ubyte"
            if gz:
                with gzip.open(d / f"{name}.gz", "wb") as f:
                    f.write(idx_bytes(arr))
            else:
                (d / name).write_bytes(idx_bytes(arr))
        out[split] = (images, labels)
    return out


def fmnist_folder(root: Path, n_train: int = 200, n_test: int = 100) -> Path:
    """Four gzipped idx files of random 28 px 'garments' (a bright square per class position):
    learnable, for the studies' tiny runs."""
    rng = np.random.default_rng(1)
    root.mkdir(parents=True, exist_ok=True)
    for stem, n in (("train", n_train), ("t10k", n_test)):
        y = np.arange(n) % 10
        x = np.zeros((n, 28, 28), dtype=np.uint8)
        for i, c in enumerate(y):
            x[i, 4 + c : 14 + c, 6:22] = rng.integers(128, 256, (10, 16))
        for kind, arr in (("images-idx3", x), ("labels-idx1", y)):
            with gzip.open(root / f"{stem}-{kind}-ubyte.gz", "wb") as f:
                f.write(idx_bytes(arr))
    return root


# ----------------------------------------------------------------------------- seeds, processes
def gen(seed: int):
    """A seeded CPU ``torch.Generator``."""
    import torch

    return torch.Generator().manual_seed(seed)


GLOO_TIMEOUT = 300.0  # s: a collective's deadline in the gloo tests (2 cores shared with a training queue)


@contextlib.contextmanager
def gloo_group(rank: int, world: int, store: Path, timeout: float = GLOO_TIMEOUT) -> Iterator[None]:
    """The gloo process group of one of :func:`spawn`'s ``world`` workers, met through the file
    ``store`` (a path no process has used yet): no TCP port to choose, so test processes running
    side by side (pytest-xdist) cannot take each other's. A collective that waits past ``timeout``
    seconds raises instead of hanging. Leaving, the ranks meet at a barrier before the group is
    destroyed: a rank that exits while another still reads from it ended that rank's gloo thread
    with std::terminate ("terminate called without an active exception", SIGABRT)."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=timeout),
    )  # fmt: skip
    finished = False
    try:
        yield
        finished = True
    finally:
        if finished:  # a rank that failed skips it: the others' next collective raises at the timeout
            dist.barrier()
        dist.destroy_process_group()


def spawn(fn: Any, args: tuple[Any, ...], nprocs: int, timeout: float, what: str = "") -> None:
    """torch.multiprocessing as a test harness (not a launcher), with a deadline instead of a hang:
    past ``timeout`` seconds the workers still running are killed and the test fails naming them,
    ``fn`` and ``what`` they were to do. A worker that raised fails the test with its traceback."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            alive = [rank for rank, p in enumerate(ctx.processes) if p.is_alive()]
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(
                f"{fn.__name__}: rank(s) {alive} of {nprocs} processes still running after {timeout:.0f} s"
                + (f", waiting for them to {what}" if what else "")
            )


# ----------------------------------------------------------------------------- a run driven from outside
# `bayesncl` with every loss computation delayed by argv[1] seconds, so that a test can signal the
# process at a known point of training. The delay changes no number: runs stay bit-identical.
PACED_CLI = """
import sys, time
import bayesncl.core.engine as t
from bayesncl.app.cli import main
delay = float(sys.argv[1])
real = t.contrastive_loss
def paced(*args, **kwargs):
    time.sleep(delay)
    return real(*args, **kwargs)
t.contrastive_loss = paced
sys.exit(main(sys.argv[2:]))
"""


def start_cli(args: list[str], delay: float = 0.0) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(
        [sys.executable, "-c", PACED_CLI, str(delay), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_for(cond: Any, proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    t0 = time.time()
    while not cond():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"run ended early (status {proc.returncode}): {err[-2000:]}")
        if time.time() - t0 > timeout:
            proc.kill()
            pytest.fail("timed out waiting for the run")
        time.sleep(0.02)


def assert_same_weights(a: Path, b: Path) -> None:
    import torch

    from bayesncl.runs.safe_load import load_checkpoint_file

    sa = load_checkpoint_file(a)["state_dict"]
    sb = load_checkpoint_file(b)["state_dict"]
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def ctrl_c() -> None:
    """SIGINT to this process, returning once its handler has run: another thread (torch's, tqdm's)
    may take the signal and the main thread run the handler later, so that two signals could merge
    into one, or one land a step late."""
    before = signal.getsignal(signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)
    deadline = time.time() + 5
    while signal.getsignal(signal.SIGINT) is before and time.time() < deadline:
        time.sleep(0.001)


def signal_at(monkeypatch: pytest.MonkeyPatch, module: Any, target: str, calls: tuple[int, ...]) -> None:
    """Send SIGINT to this process during the listed calls (1-based) of ``module.<target>``."""
    real = getattr(module, target)
    count = {"n": 0}

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        count["n"] += 1
        out = real(*args, **kwargs)
        for _ in range(calls.count(count["n"])):
            ctrl_c()
        return out

    monkeypatch.setattr(module, target, wrapped)


def error_line(capsys: pytest.CaptureFixture[str], silent: bool = False) -> str:
    """What the command wrote to stderr: exactly one line ``bayesncl: error: ...`` (returned stripped);
    ``silent``: and nothing on stdout (refused before a word of output)."""
    out, err = capsys.readouterr()
    assert not (silent and out), out
    assert err.count("\n") == 1 and err.endswith("\n") and err.startswith(ERROR), err
    return err.strip()


# ----------------------------------------------------------------------------- docs/bad-inputs.md
# Its table is the one copy of each user-facing message outside the code: a test checks a message with
# ``expect(ROW_ID, text, tmp_path)`` (``<tmp>`` stands for the test's tmp dir, ``…`` for a part that varies).
TESTS = Path(__file__).parent
DOC = TESTS.parent / "docs" / "bad-inputs.md"


def doc_rows() -> dict[str, tuple[str, str]]:
    """``{id: (message, test reference)}`` from the table in docs/bad-inputs.md."""
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 5 and re.fullmatch(r"[A-Z]\d+", cells[0]):
            msg = cells[3]
            assert msg.startswith("`` ") and msg.endswith(" ``"), line
            assert cells[0] not in rows, f"row {cells[0]} twice"
            rows[cells[0]] = (msg[3:-3], cells[4].strip("`"))
    return rows


ROWS = {row: message for row, (message, _) in doc_rows().items()}


def expect(row: str, text: str, tmp: Path) -> None:
    """``text`` (stripped) is exactly row ``row``'s message, with <tmp> and … filled in."""
    pattern = re.escape(ROWS[row]).replace(re.escape("<tmp>"), re.escape(str(tmp))).replace(
        re.escape("…"), ".+?"
    )
    assert re.fullmatch(pattern, text.strip()), f"\n got: {text.strip()}\nwant: {ROWS[row]}"
