"""The authors' evaluation protocols by dataset (issue 47, item 1): their values, the choice by
``eval.probe_protocol`` / ``eval.finetune_protocol``, and each protocol's optimiser and schedule on
small hand-made cases.

The values below were read from the authors' files (PKU-ML/non_neg; Cui-Peng-624/BayesNCL holds the
same): ``scripts/linear/cifar/simclr.yaml``, ``scripts/linear/imagenet-100/simclr.yaml``,
``scripts/finetuning/{cifar,imagenet-100}/simclr.yaml``; SGD's momentum 0.9 from
``solo/args/linear.py`` (set for ``sgd`` when the YAML gives none) and gamma 0.1 from
``solo/methods/linear.py`` (``MultiStepLR(optimizer, lr_decay_steps, gamma=0.1)``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from bayesncl.app.finetune import PROTOCOL, PROTOCOLS, _schedule, finetune_config, finetune_groups
from bayesncl.config import ConfigError, build_config
from bayesncl.core.model import build_model
from bayesncl.core.optim import LrSchedule, StepSchedule, build_optimizer
from bayesncl.metrics.paper_probe import paper_linear_probe, probe_optimizer, probe_schedule
from bayesncl.metrics.protocols import FINETUNE, LINEAR, finetune_protocol, linear_protocol, protocol_name

from ..conftest import TINY, TINY_BASE


def test_the_protocols_hold_the_authors_yaml_values() -> None:
    # scripts/linear/imagenet-100/simclr.yaml: sgd, batch 256, lr 1.0, weight_decay 0, step [60, 80],
    # max_epochs 50; scripts/finetuning/imagenet-100/simclr.yaml: the same, max_epochs 30
    for table, epochs in ((LINEAR, 50), (FINETUNE, 30)):
        p = table["imagenet"]
        assert (p.optimizer, p.batch_size, p.lr, p.weight_decay, p.momentum) == ("sgd", 256, 1.0, 0.0, 0.9)
        assert (p.schedule, p.milestones, p.gamma, p.epochs) == ("step", (60, 80), 0.1, epochs)
        # scripts/{linear,finetuning}/cifar/simclr.yaml: lars, batch 256, lr 0.4, weight_decay 1e-4,
        # eta 0.02, clip_lr, warmup_cosine (solo's defaults: 10 warmup epochs from 3e-5)
        c = table["cifar"]
        assert (c.optimizer, c.batch_size, c.lr, c.weight_decay, c.momentum) == ("lars", 256, 0.4, 1e-4, 0.9)
        assert (c.lars_eta, c.clip_lr, c.schedule, c.warmup_epochs, c.warmup_start_lr, c.epochs) == (
            0.02, True, "warmup_cosine", 10.0, 3e-5, epochs)


def test_auto_picks_by_dataset_and_an_explicit_choice_wins() -> None:
    assert protocol_name("auto", "imagefolder") == "imagenet"
    for name in ("cifar10", "cifar100", "fashion-mnist", "synthetic", "stl10"):
        assert protocol_name("auto", name) == "cifar"
    assert protocol_name("imagenet", "cifar10") == "imagenet"
    assert protocol_name("cifar", "imagefolder") == "cifar"
    assert linear_protocol("auto", "imagefolder") is LINEAR["imagenet"]
    assert finetune_protocol("auto", "fashion-mnist") is FINETUNE["cifar"]
    with pytest.raises(ConfigError, match="expected one of auto, cifar, imagenet"):
        protocol_name("imagenet100", "cifar10")
    with pytest.raises(ConfigError, match="eval.probe_protocol='sgd'"):
        build_config(overrides=["eval.probe_protocol=sgd"])
    cfg = build_config(overrides=[])
    assert (cfg.eval.probe_protocol, cfg.eval.finetune_protocol) == ("auto", "auto")


def test_step_schedule_rates_at_given_epochs() -> None:
    """MultiStepLR([60, 80], 0.1) stepped per epoch, 10 steps an epoch: 1.0 up to epoch 59, 0.1 from
    epoch 60, 0.01 from epoch 80 (hand-computed)."""
    s = StepSchedule(total_steps=1000, steps_per_epoch=10, milestones=(60, 80), gamma=0.1)
    expected = {0: 1.0, 9: 1.0, 10: 1.0, 599: 1.0, 600: 0.1, 799: 0.1, 800: 0.01, 999: 0.01}
    for step, lr in expected.items():
        assert s.at(step, 1.0) == pytest.approx(lr, rel=1e-12), step
    assert s.at(600, 2.0) == pytest.approx(0.2)  # relative to each group's peak
    opt = torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(1))], "peak_lr": 0.5}], lr=0.5)
    assert s.apply(opt, 805) == pytest.approx(0.005) and opt.param_groups[0]["lr"] == pytest.approx(0.005)


def test_each_probe_protocol_builds_its_optimiser_and_schedule() -> None:
    clf = torch.nn.Linear(4, 3)
    sgd = probe_optimizer(clf, LINEAR["imagenet"], lr=1.0, weight_decay=0.0)
    assert type(sgd) is torch.optim.SGD
    g = sgd.param_groups[0]
    assert (g["lr"], g["momentum"], g["weight_decay"], len(g["params"])) == (1.0, 0.9, 0.0, 2)
    from timm.optim import Lars

    lars = probe_optimizer(clf, LINEAR["cifar"], lr=0.4, weight_decay=1e-4)
    assert type(lars) is Lars
    w, b = lars.param_groups
    assert (w["trust_coeff"], w["trust_clip"], w["momentum"], w["weight_decay"], b["weight_decay"]) == (
        0.02, True, 0.9, 1e-4, 0.0)
    # the step protocol over 100 epochs of 2 steps: 1.0 to epoch 59, 0.1 to 79, 0.01 after
    step = probe_schedule(LINEAR["imagenet"], 1.0, epochs=100, steps_per_epoch=2)
    assert step.shape == (200,)
    assert step[119] == 1.0 and step[120] == pytest.approx(0.1) and step[160] == pytest.approx(0.01)
    # their 50 epochs end before the first milestone: the rate never decays
    assert set(probe_schedule(LINEAR["imagenet"], 1.0, epochs=50, steps_per_epoch=2).tolist()) == {1.0}
    # warmup-cosine: 3e-5 at step 0, the peak at the warmup's last step (10 epochs x 2 - 1), 0 -> near end
    cos = probe_schedule(LINEAR["cifar"], 0.4, epochs=50, steps_per_epoch=2)
    assert cos[0] == pytest.approx(3e-5) and cos[19] == pytest.approx(0.4) and cos[20] == pytest.approx(0.4)
    assert cos[-1] == pytest.approx(0.4 * 0.5 * (1 + math.cos(math.pi * 79 / 80)), rel=1e-12)


def test_imagenet_probe_runs_with_sgd_and_says_so() -> None:
    cfg = build_config(overrides=[*TINY_BASE, "data.train_subset=200", "data.test_subset=60",
                                  "eval.probe_protocol=imagenet"])  # fmt: skip
    torch.manual_seed(0)
    model = build_model(cfg, 3, 16, 10)
    out = paper_linear_probe(model, cfg, epochs=1, batch_size=64, progress=False)
    assert out["protocol"].startswith("paper imagenet: SGD lr 1 x batch/256, momentum 0.9, weight decay 0")
    assert "x0.1 at epochs 60, 80" in out["protocol"] and 0.0 <= out["acc1"] <= out["acc5"] <= 100.0


def test_finetune_protocol_by_key_sets_sgd_and_the_step_schedule() -> None:
    assert PROTOCOL is PROTOCOLS["cifar"] and PROTOCOL["train.optimizer"] == "lars"
    pre = build_config(overrides=[*TINY, "eval.finetune_protocol=imagenet"])
    cfg = finetune_config(pre, {"train.epochs": 100})
    t = cfg.train
    assert (t.optimizer, t.base_lr, t.probe_lr, t.weight_decay, t.momentum, t.batch_size) == (
        "sgd", 1.0, 1.0, 0.0, 0.9, 256)
    sched = _schedule(cfg, steps=3)
    assert isinstance(sched, StepSchedule) and sched.total_steps == 300
    assert (sched.at(179, 1.0), sched.at(180, 1.0)) == (1.0, pytest.approx(0.1))
    model = build_model(cfg, 3, 16, 10)
    for name, p in model.named_parameters():
        p.requires_grad_(name.split(".")[0] in ("backbone", "classifier"))
    opt = build_optimizer(finetune_groups(model, cfg, 256), cfg)
    assert type(opt) is torch.optim.SGD
    assert {(g["lr"], g["momentum"], g["weight_decay"]) for g in opt.param_groups} == {(1.0, 0.9, 0.0)}
    # auto on synthetic data: CIFAR's, unchanged (LARS, warmup-cosine)
    cifar = finetune_config(build_config(overrides=TINY), {})
    assert cifar.train.optimizer == "lars" and isinstance(_schedule(cifar, steps=3), LrSchedule)


def test_finetune_command_takes_the_protocol_key(tmp_path: Path) -> None:
    """``bayesncl finetune RUN eval.finetune_protocol=imagenet``: the key reaches the run (its config and
    finetune.json say so), the rate is the step schedule's (SGD lr 1.0 x 32/256, no warmup)."""
    from bayesncl.app.finetune import finetune

    from ..conftest import tiny_checkpoint

    (tmp_path / "pre").mkdir()
    src = tiny_checkpoint(tmp_path / "pre" / "run.pt", ["method.name=ncl"])
    out = finetune(src, tmp_path / "ft", ["eval.finetune_protocol=imagenet", "train.epochs=1",
                                          "train.batch_size=32", "train.progress=false"])  # fmt: skip
    assert out["protocol"].startswith("finetune (imagenet): backbone + linear head on h, sgd lr 1 (head 1)")
    assert "momentum 0.9, batch 32, weight decay 0, 1 epochs, x0.1 at epochs 60, 80" in out["protocol"]
    log = (tmp_path / "ft" / "log.csv").read_text().splitlines()
    header, row = log[0].split(","), log[1].split(",")
    assert float(row[header.index("lr")]) == pytest.approx(1.0 * 32 / 256)
