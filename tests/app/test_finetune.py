"""``bayesncl finetune``: the authors' protocol as the default, backbone + head trained end to end in a
run dir of its own (the pretrained run untouched), a bit-identical resume, and its bad inputs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

import bayesncl.core.engine as engine
from bayesncl.app.cli import main
from bayesncl.app.finetune import PROTOCOL, finetune, finetune_config, finetune_groups
from bayesncl.app.report.curves import write_training_curves
from bayesncl.config import build_config
from bayesncl.core.model import build_model
from bayesncl.runs.messages import TrainingInterrupted
from bayesncl.runs.safe_load import load_checkpoint_file

from ..conftest import ERROR, TINY, assert_same_weights, error_line, expect, signal_at, tiny_checkpoint

SMALL = ["train.epochs=2", "train.warmup_epochs=1", "train.batch_size=32", "train.progress=false"]


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.is_file()}


def test_the_train_accuracy_and_the_online_probes_are_one_function_of_the_core() -> None:
    """Fine-tuning's train accuracy and pretraining's online probe accuracy are one function,
    ``core.methods.class_accuracy`` (top-1 of the step's class logits against its labels); each
    Statistic keeps its own name, title and short name."""
    from bayesncl.app.finetune import FINETUNE_STATS, finetune_loss
    from bayesncl.core import methods

    probe, train = methods.all_statistics()["online_acc"], FINETUNE_STATS[1]
    assert probe.fn is train.fn is methods.class_accuracy
    assert (probe.name, probe.title, probe.short) == ("online_acc", "online probe accuracy (%)", "")
    assert (train.name, train.title, train.short) == ("online_acc", "train accuracy of backbone + head (%)",
                                                      "train acc")  # fmt: skip
    logits = torch.tensor([[2.0, 0.0, 1.0], [0.0, 3.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 5.0]])
    labels = torch.tensor([0, 2, 1, 2])  # right: rows 0 and 3 (row 2's tie goes to class 0, argmax's)
    assert methods.top1_accuracy(logits, labels).item() == 0.5
    assert methods.top1_accuracy(logits, torch.tensor([0, 1, 0, 2])).item() == 1.0
    loss, stats = finetune_loss(lambda x: logits, (torch.zeros(4, 1, 2, 2), None, labels))  # type: ignore[arg-type]
    assert stats["online_acc"].item() == 0.5 and stats["loss"].item() == loss.item() > 0


def test_the_default_is_the_authors_protocol() -> None:
    cfg = finetune_config(build_config(overrides=TINY), {"train.epochs": 3})
    t = cfg.train
    assert (t.epochs, t.batch_size, t.optimizer, t.base_lr, t.probe_lr) == (3, 256, "lars", 0.4, 0.4)
    assert (t.weight_decay, t.warmup_epochs, t.warmup_start_lr, t.min_lr) == (1e-4, 10.0, 3e-5, 0.0)
    assert (t.lars_eta, t.clip_lr, t.momentum) == (0.02, True, 0.9)
    assert PROTOCOL["train.epochs"] == 30
    model = build_model(cfg, 3, 16, 10)
    for name, p in model.named_parameters():
        p.requires_grad_(name.split(".")[0] in ("backbone", "classifier"))
    groups = {g["name"]: g for g in finetune_groups(model, cfg, 256)}
    assert set(groups) == {"encoder/weight", "encoder/plain", "classifier/weight", "classifier/plain"}
    assert groups["classifier/weight"]["weight_decay"] == 1e-4 == groups["encoder/weight"]["weight_decay"]
    assert groups["classifier/plain"]["weight_decay"] == 0.0 == groups["encoder/plain"]["weight_decay"]
    assert groups["encoder/weight"]["peak_lr"] == pytest.approx(0.4) == groups["classifier/weight"]["peak_lr"]
    n_trained = sum(p.numel() for g in groups.values() for p in g["params"])
    trained = [p for n, p in model.named_parameters() if n.startswith(("backbone", "classifier"))]
    assert n_trained == sum(p.numel() for p in trained)


@pytest.mark.slow
def test_finetune_trains_backbone_and_head_and_leaves_the_pretrained_run_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "pre").mkdir()
    src = tiny_checkpoint(tmp_path / "pre" / "run.pt", ["method.name=bayesncl"])
    before = _digest(src.parent)
    capsys.readouterr()
    result = finetune(src, None, SMALL)
    assert "\nprecision: " in "\n" + capsys.readouterr().out  # says what it computes in, as pretrain
    out = tmp_path / "pre" / "run-finetune"  # the default run dir: beside the pretrained one
    assert _digest(src.parent) == before == {"run.pt": before["run.pt"]}  # only read
    assert 0.0 <= result["acc1"] <= result["acc5"] <= 100.0
    assert json.loads((out / "finetune.json").read_text())["acc1"] == result["acc1"]
    ours = load_checkpoint_file(out / "last.pt")
    theirs = load_checkpoint_file(src)["state_dict"]
    assert (ours["epoch"], ours["step"]) == (2, 6)  # 96 images, batch 32: 3 steps an epoch
    changed = {k.split(".")[0] for k, v in ours["state_dict"].items() if not torch.equal(v, theirs[k])}
    assert changed == {"backbone", "classifier"}  # the projector and the gating head as pretrained
    assert ours["config"]["train"]["base_lr"] == 0.4 and ours["config"]["train"]["epochs"] == 2
    assert (out / "encoder.safetensors").exists() and len((out / "log.csv").read_text().splitlines()) == 3
    # its curves at its end, as pretrain draws its own (`bayesncl curves` draws the same figure)
    again = write_training_curves([out], tmp_path / "again.png", labels=["finetune bayesncl"])
    assert (out / "training_curves.png").read_bytes() == again.read_bytes()


@pytest.mark.slow
def test_an_interrupted_finetune_resumes_bit_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tiny_checkpoint(tmp_path / "run.pt", ["method.name=ncl"])
    finetune(src, tmp_path / "straight", SMALL)
    signal_at(monkeypatch, engine, "train_step", (4,))  # the first step of epoch 2
    with pytest.raises(TrainingInterrupted, match="stopped in epoch 2 after 1 of its 3 steps"):
        finetune(src, tmp_path / "run", SMALL)
    monkeypatch.undo()
    finetune(src, tmp_path / "run", resume=True)  # its own config: SMALL need not be repeated
    assert_same_weights(tmp_path / "straight" / "last.pt", tmp_path / "run" / "last.pt")


@pytest.mark.slow
def test_resume_takes_the_runs_own_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, run = tiny_checkpoint(tmp_path / "run.pt", ["method.name=ncl"]), tmp_path / "ft"
    assert main(["finetune", str(src), "--run-dir", str(run)]) == 2  # the protocol's batch 256 > 96 images
    out, err = capsys.readouterr()
    assert out == "" and "batch_size=256 is larger than the 96 training samples of synthetic" in err
    assert not run.exists()
    assert main(["finetune", str(src), "--run-dir", str(run), *SMALL, "train.epochs=1"]) == 0
    capsys.readouterr()
    listing = sorted(p.name for p in run.iterdir())
    # a key that may not change: refused as pretrain --resume refuses it, before a word on stdout
    assert main(["finetune", str(src), "--run-dir", str(run), "--resume", "train.batch_size=16"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(
        "bayesncl: error: --resume: the config differs from the run's in: train.batch_size: 32 -> 16 (run's"
    )
    # eval.data.* is the data fine-tuned on (data.*): its change is refused the same way
    data = ["eval.data.name=synthetic", "eval.data.train_subset=64", "eval.data.test_subset=60"]
    assert main(["finetune", str(src), "--run-dir", str(run), "--resume", *data]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(
        "bayesncl: error: --resume: the config differs from the run's in: data.train_subset: 96 -> 64 (run's"
    )
    assert sorted(p.name for p in run.iterdir()) == listing
    same = [*data[:1], "eval.data.train_subset=96", *data[2:]]  # the run's own data: resumed
    assert main(["finetune", str(src), "--run-dir", str(run), "--resume", "train.epochs=2", *same]) == 0
    ckpt = load_checkpoint_file(run / "last.pt")
    assert (ckpt["epoch"], ckpt["step"], ckpt["config"]["train"]["batch_size"]) == (2, 6, 32)


def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    photos = tmp_path / "photos"  # a folder of images without classes: no labels
    photos.mkdir()
    for i in range(4):
        Image.new("RGB", (20, 20), (i * 40, 0, 0)).save(photos / f"{i}.png")
    unlabelled = tiny_checkpoint(
        tmp_path / "u.pt", ["data.name=imagefolder", f"data.root={photos}", "data.train_subset=0",
                            "data.test_subset=0"], num_classes=1,
    )
    notes = tmp_path / "notes.pt"
    notes.write_text("hello world")
    src = tiny_checkpoint(tmp_path / "run.pt", [])
    cases = [
        ("V1", [str(unlabelled)]),
        ("V2", [str(notes)]),
        ("V3", [str(src), "--run-dir", str(tmp_path)]),
        ("V4", [str(src), "method.lam=0.1"]),
    ]
    for row, args in cases:
        listing = sorted(p.name for p in tmp_path.iterdir())
        assert main(["finetune", *args]) == 2
        expect(row, error_line(capsys), tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == listing, row  # nothing written


@pytest.mark.slow
def test_resume_refuses_another_pretrained_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--resume reads the source's config (not its weights): one of another method and proj_dim is
    refused in one line, nothing written; the run's own source, as a file or its encoder, resumes."""
    import bayesncl.app.evaluate as evaluate

    a = tiny_checkpoint(tmp_path / "a.pt", ["method.name=ncl"])
    b = tiny_checkpoint(tmp_path / "b.pt", ["method.name=cl", "model.proj_dim=8"])
    run = tmp_path / "ft"
    assert main(["finetune", str(a), "--run-dir", str(run), *SMALL, "train.epochs=1"]) == 0
    capsys.readouterr()
    before = _digest(run)
    monkeypatch.setattr(evaluate, "load_trained", None)  # a resume never loads the source's weights
    assert main(["finetune", str(b), "--run-dir", str(run), "--resume", "train.epochs=2"]) == 2
    line = error_line(capsys)
    expect("V9", line, tmp_path)
    assert "model.proj_dim: 16 -> 8; method.name: 'ncl' -> 'cl'; method.nonneg" in line
    assert _digest(run) == before and json.loads((run / "finetune.json").read_text())["source"] == str(a)
    read = [evaluate.trained_config(p) for p in (b, run, run / "encoder.safetensors")]  # .pt, dir, export
    assert [(c.method.name, c.model.proj_dim) for c in read if c] == [("cl", 8), ("ncl", 16), ("ncl", 16)]
    assert main(["finetune", str(a), "--run-dir", str(run), "--resume", "train.epochs=2"]) == 0
    result = json.loads((run / "finetune.json").read_text())
    assert (result["source"], result["method"], result["epochs"]) == (str(a), "ncl", 2)


@pytest.mark.slow
def test_resume_refuses_a_source_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--resume reads the pretrained source's config: a missing source, and one whose config is damaged
    (a 'config' entry edited or gone, an export's metadata, a config.yaml), are one line each and write
    nothing; they resumed silently, unchecked. Only the authors' layout records no config by design."""
    import shutil

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from bayesncl.app.evaluate import trained_config

    a = tiny_checkpoint(tmp_path / "a.pt", ["method.name=ncl"])
    run = tmp_path / "ft"
    assert main(["finetune", str(a), "--run-dir", str(run), *SMALL, "train.epochs=1"]) == 0
    capsys.readouterr()
    before = _digest(run)
    ckpt = torch.load(a, weights_only=True)
    torch.save({**ckpt, "config": "ncl"}, tmp_path / "edited.pt")
    torch.save({k: v for k, v in ckpt.items() if k != "config"}, tmp_path / "no-config.pt")
    with safe_open(str(run / "encoder.safetensors"), framework="pt") as f:
        meta = f.metadata()
    (tmp_path / "export").mkdir()
    export = tmp_path / "export" / "encoder.safetensors"
    save_file(load_file(str(run / "encoder.safetensors")), str(export), metadata={**meta, "config": "{ncl"})
    src_run = tmp_path / "src-run"
    src_run.mkdir()
    shutil.copy(a, src_run / "last.pt")
    (src_run / "config.yaml").write_text("method: [")
    (tmp_path / "text.pt").write_text("my notes on the run")  # no checkpoint at all: said what to do
    resume = ["--run-dir", str(run), "--resume", "train.epochs=2"]
    cases = {
        tmp_path / "gone.pt": "V10",
        tmp_path / "edited.pt": "V11",
        tmp_path / "text.pt": "V12",
        tmp_path / "no-config.pt": (
            f"{ERROR}--resume: {tmp_path / 'no-config.pt'} is a bayesncl-checkpoint-v1 checkpoint without "
            "its 'config' entry (damaged or edited): use another copy, or an earlier checkpoint of the run "
            "(epoch-NNNN.pt)"
        ),
        export: f"{ERROR}--resume: {export}: the config in its metadata is not valid JSON",
        src_run: f"{ERROR}--resume: config file '{src_run / 'config.yaml'}' is not valid YAML",
    }
    for source, want in cases.items():
        assert main(["finetune", str(source), *resume]) == 2, source
        line = error_line(capsys)
        if want in ("V10", "V11", "V12"):
            expect(want, line, tmp_path)
        else:
            assert line.startswith(want), line
        assert _digest(run) == before
    # every source that does not read as a model checkpoint gets V12's advice after its short reason
    # (they said torch's own words, or "pickle opcode 149 ...", and nothing to do)
    import pickle
    import zipfile

    with zipfile.ZipFile(tmp_path / "notes.zip.pt", "w") as z:
        z.writestr("notes.txt", "not a torch archive")
    whole = a.read_bytes()
    (tmp_path / "cut.pt").write_bytes(whole[: len(whole) // 2])  # a real checkpoint, cut short
    (tmp_path / "pickled.pt").write_bytes(pickle.dumps({"lr": 0.1}))  # protocol 5: refused, not run
    (tmp_path / "pickled2.pt").write_bytes(pickle.dumps([1, 2], protocol=2))
    torch.save([1, 2], tmp_path / "list.pt")
    unreadable = "is not a readable PyTorch checkpoint (truncated or damaged? "
    junk = {
        "notes.zip.pt": unreadable, "cut.pt": unreadable, "pickled2.pt": unreadable,
        "pickled.pt": "was refused by the safe loader (torch.load weights_only=True): it holds pickle opcode "
                      "149, which plain tensor checkpoints do not use; give",
        "list.pt": "is not a model checkpoint bayesncl can read: it holds a list, expected a dict; give",
    }  # fmt: skip
    for name, why in junk.items():
        assert main(["finetune", str(tmp_path / name), *resume]) == 2, name
        line = error_line(capsys)
        assert line.startswith(f"{ERROR}--resume: {tmp_path / name} {why}"), line
        assert line.endswith(
            f"; give the pretrained source {run} was started from (its run dir, checkpoint or "
            "encoder.safetensors)"
        ), line
        assert line.count("; give") == 1 and "nothing in it was run" not in line, line
        assert _digest(run) == before
    official = tmp_path / "official.ckpt"  # the authors' layout: backbone.* weights, no config
    torch.save({"state_dict": {"backbone.conv1.weight": torch.zeros(64, 3, 3, 3)}}, official)
    assert trained_config(official) is None
    notes = tmp_path / "notes.pt"
    torch.save({"lr": 0.1}, notes)  # neither ours nor the authors': not taken as "records no config"
    with pytest.raises(ValueError, match="is not a model checkpoint bayesncl can read"):
        trained_config(notes)

