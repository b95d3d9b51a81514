"""Where a user waits, the command says so (issue 46.5): the projected training time before the
first step on a CPU (and the hint toward a CPU recipe where it is long), stage lines for the
end-of-training evaluation and the report, and the files README's "Run directory" promises."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from bayesncl.app import fit as fit_module
from bayesncl.app import train as train_module
from bayesncl.app.report.html import write_report_or_warn
from bayesncl.app.train import pretrain
from bayesncl.config import build_config

from ..conftest import ROOT, TINY

LOUD = [*TINY, "train.progress=true"]


def _mark_first_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Print ``<first epoch begins>`` on stdout as the loop enters its first epoch (before step 1)."""
    real = fit_module.train_one_epoch

    def marked(*args, **kwargs):
        print("<first epoch begins>", flush=True)
        return real(*args, **kwargs)

    monkeypatch.setattr(fit_module, "train_one_epoch", marked)


def test_projection_is_printed_before_the_first_step_and_changes_no_weight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _mark_first_step(monkeypatch)
    pretrain(build_config(overrides=[*LOUD, "train.epochs=2"]), tmp_path / "loud", evaluate=False)
    out = capsys.readouterr().out.splitlines()
    line = next(i for i, s in enumerate(out) if s.startswith("projected training time: "))
    assert line < out.index("<first epoch begins>")
    # TINY: 96 images, batch 32, 2 epochs = 6 steps
    m = re.fullmatch(r"projected training time: (\d+):(\d\d):(\d\d) \(h:mm:ss\) for 6 steps of 2 epochs at "
                     r"(\d+\.\d\d) s a step \(timed here on 2 steps; .*\)", out[line])  # fmt: skip
    assert m is not None, out[line]
    seconds = int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3])
    assert seconds == round(6 * float(m[4])) or abs(seconds - 6 * float(m[4])) <= 0.5 + 6 * 0.005
    assert not any(s.startswith("hint: ") for s in out)  # a short run has no hint
    # the timing runs on a model of its own and puts every RNG state back: the same weights as quiet
    pretrain(build_config(overrides=[*TINY, "train.epochs=2"]), tmp_path / "quiet", evaluate=False)
    assert "projected" not in capsys.readouterr().out  # train.progress=false: no timing, no line
    a = torch.load(tmp_path / "loud" / "last.pt", weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "quiet" / "last.pt", weights_only=True)["state_dict"]
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_a_long_projection_names_the_cpu_recipes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(train_module, "CPU_WARN_AFTER_S", 0)  # every run is "long"
    _mark_first_step(monkeypatch)
    pretrain(build_config(overrides=LOUD), tmp_path / "r", evaluate=False)
    out = capsys.readouterr().out.splitlines()
    hint = out.index(next(s for s in out if s.startswith("hint: ")))
    assert hint < out.index("<first epoch begins>")
    assert "--config fashion-mnist-demo" in out[hint] and "--config fashion-mnist-long" in out[hint]


def test_evaluation_and_report_say_their_stages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "r"
    pretrain(build_config(overrides=[*LOUD, "method.name=bayesncl"]), run)
    err = capsys.readouterr().err.replace("\r", "\n")  # a progress bar erases its line with \r
    stages = re.findall(r"^bayesncl evaluation: (.+) \(\d+\.\d s so far\)$", err, flags=re.M)
    assert stages == [
        "extracting the test split's features", "extracting the train split's features (for the probe)",
        "metrics", "fast linear probe on h", "figures (top_activations.png, suppressed_features.png)",
    ]
    assert re.search(r"^bayesncl evaluation: done in \d+\.\d s$", err, flags=re.M)
    write_report_or_warn([run], tmp_path / "report")
    err = capsys.readouterr().err.replace("\r", "\n")
    assert re.findall(r"^report: \[(\d)/2\] ", err, flags=re.M) == ["1", "2"]
    assert re.search(r"^report: done in \d+\.\d s$", err, flags=re.M)


def test_quiet_runs_say_no_stage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pretrain(build_config(overrides=TINY), tmp_path / "r")
    write_report_or_warn([tmp_path / "r"], tmp_path / "report")
    assert capsys.readouterr().err.count("so far)") == 0


def test_pretrain_writes_the_figures_readme_names_and_no_embedding_map(tmp_path: Path) -> None:
    """README's "Run directory" names the figures of pretrain's run dir and says that the embedding
    map is evaluate's; the run dir holds exactly those."""
    run = tmp_path / "r"
    pretrain(build_config(overrides=[*TINY, "method.name=bayesncl"]), run)
    written = {p.name for p in run.glob("*.png")}
    assert written == {"training_curves.png", "top_activations.png", "suppressed_features.png",
                       "sparsity.png"}
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Run directory", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([a-z_]+\.png)`", section))
    assert written <= named
    assert "embedding.png" in named  # named as what the run dir does not hold until `evaluate`
    assert re.search(r"no `embedding\.png`.{0,120}`bayesncl evaluate RUN_DIR`", section.replace("\n", " "))
