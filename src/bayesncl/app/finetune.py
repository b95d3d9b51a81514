"""``bayesncl finetune RUN``: the pretrained backbone and a new linear head trained end to end on the
labelled train split, then test Acc@1/Acc@5: the NCL paper's fine-tuning evaluation (README,
"Fine-tuning"). The default is the authors' protocol for the data, :data:`PROTOCOLS` by
``eval.finetune_protocol`` (``auto``: ``imagenet`` for ``data.name=imagefolder``, else ``cifar``):
:data:`PROTOCOL`, PKU-ML/non_neg ``scripts/finetuning/cifar/simclr.yaml`` run by
``solo/methods/linear.py`` with ``finetune: True``, or ``scripts/finetuning/imagenet-100/simclr.yaml``
(SGD lr 1.0, weight decay 0, ×0.1 at epochs 60 and 80, :mod:`bayesncl.metrics.protocols`);
PAPER-NOTES §2: one lr for backbone and head, as that code never reads the YAML's
``classifier_lr``), with random resized crops (bilinear), flips and BatchNorm in train mode.

It trains in a run dir of its own with pretraining's loop (:func:`bayesncl.app.fit.fit`, a
:func:`finetuning_job`; docs/architecture.md) and only reads the pretrained run. Its statistics are
:data:`FINETUNE_STATS` (defined beside the methods' statistics, :mod:`bayesncl.core.methods.common`),
logged as pretraining's are: in its ``log.csv`` (``epoch, step, loss,
online_acc, lr, epoch_time_s``) and ``steps.csv``, ``loss`` is the cross-entropy and ``online_acc``
the head's accuracy (%) on the augmented train batches (the first of the loader's two views).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from bayesncl.app.fit import Job, export_trained, fit
from bayesncl.config import (
    Config,
    ConfigError,
    EvalDataConfig,
    build_config,
    check_keys,
    eval_data,
    parse_overrides,
)
from bayesncl.core.engine import LossFn, Views
from bayesncl.core.methods import FINETUNE_STATS, Step
from bayesncl.core.model import ContrastiveModel, build_model
from bayesncl.core.optim import LrSchedule, StepSchedule
from bayesncl.metrics.protocols import FINETUNE, Protocol, finetune_protocol


def protocol_settings(protocol: Protocol) -> dict[str, Any]:
    """The ``train.*`` values that carry ``protocol`` (one lr for backbone and head: ``train.probe_lr`` is
    the classifier's); its step decay, which no ``train.*`` key holds, is read in :func:`_schedule`."""
    return {
        "train.epochs": protocol.epochs, "train.batch_size": protocol.batch_size,
        "train.optimizer": protocol.optimizer, "train.base_lr": protocol.lr, "train.probe_lr": protocol.lr,
        "train.weight_decay": protocol.weight_decay, "train.momentum": protocol.momentum,
        "train.lars_eta": protocol.lars_eta, "train.clip_lr": protocol.clip_lr,
        "train.warmup_epochs": protocol.warmup_epochs, "train.warmup_start_lr": protocol.warmup_start_lr,
        "train.min_lr": 0.0, "train.monitor_samples": 0,
    }  # fmt: skip


#: What ``finetune`` sets on the pretrained run's config before the user's ``train.*`` overrides, by
#: ``eval.finetune_protocol`` (:mod:`bayesncl.metrics.protocols`): the authors' CIFAR fine-tuning
#: protocol (module docstring) and their ImageNet-100 one (SGD lr 1.0, weight decay 0, step decay).
PROTOCOLS: dict[str, dict[str, Any]] = {name: protocol_settings(p) for name, p in FINETUNE.items()}
#: The CIFAR protocol's settings (the one every dataset but ``imagefolder`` gets by default).
PROTOCOL: dict[str, Any] = PROTOCOLS["cifar"]
#: The keys ``finetune`` takes besides ``data.*`` and ``eval.*`` (which go to the loading, as for evaluate).
TRAIN_KEYS = ("train.", "seed")


class FinetuneForward(nn.Module):
    """What the loop (and DDP) runs: ``classifier(backbone(x))``, logits (B, classes)."""

    def __init__(self, model: ContrastiveModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model.classifier(self.model.backbone(x))


def finetune_loss(
    step_model: nn.Module, batch: Views, *, autocast: Any = None, channels_last: bool = False
) -> tuple[Tensor, dict[str, Tensor]]:
    """The fine-tuning step's cross-entropy on the first view ``x1`` (n, C, S, S) of ``batch`` =
    (x1, x2, y) with labels ``y`` (n,), in ``autocast`` (a ``torch.autocast`` or None) on
    channels-last input where ``channels_last``; and its :data:`FINETUNE_STATS` by name (``x2`` unused)."""
    x1, _, y = batch
    x = x1.contiguous(memory_format=torch.channels_last) if channels_last else x1
    with autocast if autocast is not None else nullcontext():
        logits = step_model(x)
    loss = nn.functional.cross_entropy(logits.float(), y)
    with torch.no_grad():
        step = Step(loss, {}, None, logits, y)
        stats = {s.name: s.fn(step) for s in FINETUNE_STATS}
    return loss, stats


def finetune_loss_fn(autocast: Any, channels_last: bool) -> LossFn:
    """:func:`finetune_loss` as the loop's :data:`~bayesncl.core.engine.LossFn`."""

    def loss_fn(step_model: nn.Module, batch: Views) -> tuple[Tensor, dict[str, Tensor]]:
        return finetune_loss(step_model, batch, autocast=autocast, channels_last=channels_last)

    return loss_fn


def finetune_config(
    pretrained: Config, train_overrides: dict[str, Any], protocol: dict[str, Any] | None = None
) -> Config:
    """The fine-tuning run's config: ``pretrained``'s, reading its labelled data (``data.*`` with labels,
    or ``eval.data.*`` where set: :func:`bayesncl.config.eval_data`), with ``protocol`` (``None``: the
    :data:`PROTOCOLS` entry of ``pretrained``'s ``eval.finetune_protocol`` on that data; ``{}`` for a
    resumed run's own config) and then ``train_overrides`` (dotted ``train.*``/``seed``) set. Raises
    ConfigError for a bad value."""
    no_eval_data = replace(pretrained.eval, data=EvalDataConfig())
    labelled = replace(pretrained, data=eval_data(pretrained), eval=no_eval_data)
    if protocol is None:
        protocol = protocol_settings(finetune_protocol(pretrained.eval.finetune_protocol, labelled.data.name))
    return build_config(labelled, {**protocol, **train_overrides})


def _schedule(cfg: Config, steps: int) -> LrSchedule | StepSchedule:
    """The run's lr schedule over ``cfg.train.epochs`` epochs of ``steps`` steps: its protocol's step
    decay (``imagenet``: × gamma at the milestone epochs), else warmup-cosine from ``train.*``."""
    protocol = finetune_protocol(cfg.eval.finetune_protocol, cfg.data.name)
    total = cfg.train.epochs * steps
    if protocol.schedule == "step":
        return StepSchedule(total, steps, protocol.milestones, protocol.gamma)
    return LrSchedule(total, round(cfg.train.warmup_epochs * steps), start=cfg.train.warmup_start_lr,
                      final=cfg.train.min_lr)  # fmt: skip


def default_run_dir(source: Path) -> Path:
    """``RUN-finetune`` beside a run dir ``RUN``, ``DIR/NAME-finetune`` for a checkpoint ``DIR/NAME.pt``."""
    return source.parent / f"{source.name if source.is_dir() else source.stem}-finetune"


def _refuse_bad_request(source: Path, run_dir: Path, user: dict[str, Any]) -> None:
    """ConfigError for a key that would change the pretrained model, or a run dir that is the
    pretrained run's own folder (finetuning never alters it)."""
    check_keys(user)
    fixed = [k for k in user if not k.startswith(("data.", "eval.", *TRAIN_KEYS))]
    if fixed:
        raise ConfigError(
            f"{', '.join(fixed)} cannot be set for finetune (the pretrained run defines the model); it takes "
            "train.*, seed, data.* and eval.*"
        )
    home = source if source.is_dir() else source.parent
    if run_dir.resolve() == home.resolve():
        raise ConfigError(
            f"--run-dir {run_dir} is the pretrained run's folder: finetune writes a run of its own and never "
            "alters the pretrained one; choose another --run-dir"
        )


def _check_labelled(cfg: Config, source: Path) -> Any:
    """The labelled data's DatasetInfo; DataError for data without labels or with one class."""
    from bayesncl.data import DataError, dataset_info

    info = dataset_info(cfg.data)
    if not info.labeled or info.num_classes < 2:
        raise DataError(
            f"{source}: its data ({cfg.data.name}) has no labels, and finetune trains a classifier: give "
            "labelled data with eval.data.name=NAME (and eval.data.root=DIR)"
        )
    return info


def _check_source(source: Path, cfg: Config, run_dir: Path) -> None:
    """On --resume: one line where ``source`` is missing, its config cannot be read (a damaged
    config.yaml, metadata or ``config`` entry: EvalError / CheckpointError / ConfigError) or it records
    a model or method other than the one the run in ``run_dir`` (config ``cfg``) fine-tunes
    (ConfigError); its config is read, not its weights (:func:`bayesncl.app.evaluate.trained_config`).
    A source that does not read as a model checkpoint (NotACheckpoint: not one at all, truncated,
    damaged, refused by the safe loader; UnreadableCheckpoint: it reads, but holds no model) is told to
    give the source the run was started from. Weights that record none by design (the authors' layout)
    are taken as given."""
    from bayesncl.app.evaluate import UnreadableCheckpoint, trained_config
    from bayesncl.metrics.inputs import EvalError
    from bayesncl.runs.messages import describe_config_diff
    from bayesncl.runs.safe_load import CheckpointError, NotACheckpoint

    if not source.exists():
        raise EvalError(
            f"--resume: the pretrained source {source} does not exist (no such run dir or checkpoint file): "
            f"--resume reads its config, to check it is the model {run_dir} fine-tunes; give the source the "
            "run was started from"
        )
    try:
        pretrained = trained_config(source)
    except (NotACheckpoint, UnreadableCheckpoint) as e:  # what the file is, or why it does not read: to do?
        raise CheckpointError(
            f"--resume: {e.reason if isinstance(e, NotACheckpoint) else e}; give the pretrained source "
            f"{run_dir} was started from (its run dir, checkpoint or encoder.safetensors)"
        ) from None
    except (EvalError, CheckpointError, ConfigError) as e:
        raise type(e)(f"--resume: {e}") from None
    if pretrained is None:
        return
    diff = describe_config_diff(cfg, replace(cfg, model=pretrained.model, method=pretrained.method))
    if diff:
        raise ConfigError(
            f"--resume: {source} is not the model {run_dir} fine-tunes: its config differs from the run's "
            f"in: {diff} (run's -> {source}'s); give the source the run was started from, or a new --run-dir"
        )


def finetune(
    source: str | Path, run_dir: str | Path | None = None, overrides: list[str] | None = None, *,
    resume: bool = False, overwrite: bool = False,
) -> dict[str, Any]:
    """Fine-tune the encoder of ``source`` (a run dir, checkpoint or ``encoder.safetensors``) into
    ``run_dir`` (default :func:`default_run_dir`); returns ``{"acc1", "acc5", ...}`` (percent, test
    split), also written as ``RUN_DIR/finetune.json`` / ``.md``.

    overrides: ``train.*``/``seed`` on top of :data:`PROTOCOL`; ``data.*``/``eval.*`` as for
    ``evaluate`` (the data read: ``eval.data.*`` for a run pretrained without labels). ``resume``:
    the run dir's own config (its config.yaml, the data it fine-tunes on as ``data.*``), ``overrides``
    on top (``eval.data.*`` read as that data) and checked as pretrain's ``--resume`` checks them;
    ``source`` must be there and record the run's model and method (its config read, not its
    weights; only the authors' layout records none). Raises
    ConfigError / EvalError / CheckpointError / DataError / RunDirError (one line) before anything is
    written for a bad request, a checkpoint that does not load (on ``resume``: a source that is
    missing or whose config cannot be read), data without labels or an unusable run dir."""
    from bayesncl.app.evaluate import load_trained
    from bayesncl.core import distributed
    from bayesncl.data.loaders import check_batch_size
    from bayesncl.runs.export import resume_config
    from bayesncl.runs.rundir import RunDir

    src = Path(source)
    given = list(overrides or [])
    user = parse_overrides(given)
    out_dir = Path(run_dir) if run_dir is not None else default_run_dir(src)
    _refuse_bad_request(src, out_dir, user)
    if resume:  # the run's own config, key=value given now on top, as pretrain --resume; weights: last.pt
        # eval.data.* given now is the data fine-tuned on, as for a new run: RunDir refuses a change of it
        # (but data.root) as any other
        cfg = finetune_config(resume_config(out_dir, given), {}, protocol={})
        _check_source(src, cfg, out_dir)
        info = _check_labelled(cfg, src)
        model = build_model(cfg, info.channels, info.image_size, info.num_classes)
    else:
        loading = [o for o in given if o.split("=", 1)[0].strip().startswith(("data.", "eval."))]
        model, pretrained, _ = load_trained(src, torch.device("cpu"), loading, command="finetune")
        cfg = finetune_config(pretrained, {k: v for k, v in user.items() if k.startswith(TRAIN_KEYS)})
        info = _check_labelled(cfg, src)
    world = distributed.setup(cfg.train.device)
    try:
        check_batch_size(cfg.train.batch_size, info.num_train, info.name, world.world_size)  # before run dir:
        with RunDir(out_dir, cfg, world, resume=resume, overwrite=overwrite) as run:
            model = fit(cfg, run, finetuning_job(cfg, model, info, world.world_size))
            result = _test(model, cfg, run.path, info, src) if world.is_main else {}
            run.log_results(result)
        return result
    finally:
        world.close()


def _prepare(model: ContrastiveModel, cfg: Config, num_classes: int) -> ContrastiveModel:
    """A new linear head (seeded by ``seed``) on h; only backbone and head train (the projector and the
    gating head are kept as pretrained, for the export)."""
    torch.manual_seed(cfg.seed)
    model.classifier = nn.Linear(model.h_dim, num_classes)
    for name, p in model.named_parameters():
        p.requires_grad_(name.split(".")[0] in ("backbone", "classifier"))
    return model


def finetune_groups(model: ContrastiveModel, cfg: Config, global_batch: int) -> list[dict[str, Any]]:
    """:func:`bayesncl.core.optim.param_groups` of the trainable parts (backbone at ``train.base_lr``,
    head at ``train.probe_lr``, both × batch/256), with the head's weight decayed too, as the
    authors' fine-tuning decays every tensor that is not 1-D."""
    from bayesncl.core.optim import param_groups, peak_lrs

    groups = param_groups(model, cfg, peak_lrs(cfg, global_batch))
    for g in groups:
        if g["name"] == "classifier/weight":
            g["weight_decay"] = cfg.train.weight_decay
    return groups


def finetuning_job(cfg: Config, model: ContrastiveModel, info: Any, world_size: int) -> Job:
    """What fine-tuning trains (a :class:`bayesncl.app.fit.Job`): the pretrained ``model`` with a new
    head (:func:`_prepare`) on crops and flips of the labelled data (``info``: its DatasetInfo), its
    cross-entropy and :data:`FINETUNE_STATS`, :func:`finetune_groups` for a global batch of
    ``world_size`` processes, the protocol's schedule (:func:`_schedule`)."""
    return Job(
        name=f"finetune {cfg.method.name}", stats=FINETUNE_STATS,
        build_model=lambda: _prepare(model, cfg, info.num_classes),
        param_groups=lambda m: finetune_groups(m, cfg, cfg.train.batch_size * world_size),
        schedule=lambda steps: _schedule(cfg, steps), make_loss_fn=finetune_loss_fn, forward=FinetuneForward,
        loader_options={"crop_flip_only": True},
    )  # fmt: skip


def _test(model: ContrastiveModel, cfg: Config, run_dir: Path, info: Any, source: Path) -> dict[str, Any]:
    """Test Acc@1/Acc@5 of backbone + head in eval mode; writes finetune.json/.md, then the training
    curves and the encoder (:func:`~bayesncl.app.fit.export_trained`)."""
    from bayesncl.app.report import write_results
    from bayesncl.data import build_eval_loader
    from bayesncl.metrics.paper_probe import accuracy

    device = next(model.parameters()).device
    model.eval()
    loader = build_eval_loader(cfg.data, "test", cfg.eval.batch_size, device=device)
    acc1, acc5 = accuracy(model.backbone, model.classifier, loader, info.num_classes)
    t = cfg.train
    protocol = finetune_protocol(cfg.eval.finetune_protocol, cfg.data.name)
    if protocol.schedule == "step":
        sched = f"x{protocol.gamma:g} at epochs {', '.join(map(str, protocol.milestones))}"
    else:
        sched = f"warmup {t.warmup_epochs:g} then cosine"
    result = {
        "acc1": acc1, "acc5": acc5, "method": cfg.method.name, "source": str(source), "data": cfg.data.name,
        "n_test": info.num_test, "epochs": t.epochs,
        "protocol": f"finetune ({protocol.name}): backbone + linear head on h, {t.optimizer} lr "
        f"{t.base_lr:g} (head {t.probe_lr:g}) x batch/256, momentum {t.momentum:g}, batch {t.batch_size}, "
        f"weight decay {t.weight_decay:g}, {t.epochs} epochs, {sched}, crops+flips",
    }  # fmt: skip
    md = (f"| method | Acc@1 | Acc@5 |\n|---|---:|---:|\n| {cfg.method.name} | {acc1:.2f} | {acc5:.2f} |\n\n"
          f"{result['protocol']}; pretrained run: {source}")  # fmt: skip
    write_results(run_dir, "finetune", result, md)
    export_trained(model, cfg, run_dir, f"finetune {cfg.method.name}")
    print(f"finetune: test Acc@1 {acc1:.2f} %, Acc@5 {acc5:.2f} % ({run_dir / 'finetune.json'})", flush=True)
    return result
