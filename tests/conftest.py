"""What the tests share: tiny CPU settings (synthetic 16 px images, a small CNN, a few steps per
epoch), a tiny untrained checkpoint, a small image folder, the one-line error check, and the
messages of docs/bad-inputs.md (:func:`expect` checks a text against a row's message).

Test modules import the helpers (``from .conftest import TINY_BASE``); each adds its own
``train.epochs`` where it needs another than :data:`TINY`'s one epoch."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

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


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """What the command wrote to stderr: exactly one line ``bayesncl: error: ...`` (returned stripped)."""
    err = capsys.readouterr().err
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
