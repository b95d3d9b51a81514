"""``benchmarks/gpu_check.sh`` end to end in its dry run (``DRY_RUN=1``: tiny sizes on the CPU, compile
off, the CUDA-only steps skipped): it runs the real loop twice, prints eager and "compiled" pairs/s with
the target and the projected minutes of 200 CIFAR-100 epochs, trains and evaluates, and writes its files.
What it measures on a GPU is not tested here (no GPU); its step limits are."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import ROOT, SRC

SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def test_step_limits_sum_well_under_8_minutes() -> None:
    """Every step has a time limit and together they leave a minute of the 8 for start-up and output."""
    text = SCRIPT.read_text()
    limits = [int(n) for n in re.findall(r'timeout "\$\(lim (\d+)\)"', text)]
    assert len(limits) == 6 and sum(limits) == 420 <= 7 * 60
    assert text.count("timeout ") == len(limits)  # no step without its limit
    assert "limits below sum to 420 s" in text


def _loop(out: Path, name: str) -> dict[str, float]:
    text = (out / f"loop_{name}.json").read_text()
    return json.loads(text[text.index("\n{\n") + 1:])


@pytest.mark.slow  # a few seconds of work, ~20 s of Python start-ups; minutes on a shared 2-core CPU
def test_dry_run_end_to_end(tmp_path: Path) -> None:
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(tmp_path), "PYTHON": sys.executable,
           "PYTHONPATH": str(SRC)}
    p = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=1500)
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout
    assert "dry run on the CPU" in out and out.count("exit 0") == 3, out[-3000:]
    eager, compiled = _loop(tmp_path, "eager"), _loop(tmp_path, "compiled")
    assert eager["compile"] is False and compiled["compile"] is False  # compile off in the dry run
    for name, r in (("eager", eager), ("compiled (compile=False, default)", compiled)):
        rate = r["images_per_s"]
        row = next(line for line in out.splitlines() if line.startswith(name))
        numbers = [float(x.replace(",", "")) for x in re.findall(r"-?[\d,]+\.?\d*", row[len(name):])]
        assert numbers[0] == pytest.approx(round(rate), abs=0.5)  # pairs/s
        assert numbers[1] == pytest.approx(rate / 11_200, abs=0.006)  # x target
        assert numbers[2] == pytest.approx(200 * 50_000 / rate / 60, rel=1e-3, abs=0.06)  # minutes
        assert numbers[3] == pytest.approx(r["warmup_s"], abs=0.06)
        assert r["warmup_s"] == pytest.approx(r["first_epoch_s"] - r["epoch_time_s"][0], abs=0.06)
    assert "target 11,200 pairs/s (200 epochs in 14.9 min); aim 20,000 (8.3 min)" in out
    assert "skipped (dry run" in out and (tmp_path / "summary.txt").exists()
    assert (tmp_path / "pretrain_log.csv").read_text().count("\n") == 3  # header + 2 epochs
