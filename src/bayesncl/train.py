"""The pretraining loop: one function, readable top to bottom (DINO's style).

``pretrain(cfg, run_dir)`` validates everything first (config, data, batch size, run dir), then
creates the run dir, trains with LARS and a per-iteration warmup-cosine schedule, checkpoints
atomically every epoch, and finally evaluates the test split (see ``bayesncl.evaluation``).

Run dir layout::

    config.yaml     the fully resolved config
    log.csv         one row per epoch (loss parts, gate health, online probe, lr, time)
    last.pt         full state (model, optimiser, scaler, RNGs, epoch, step, log), atomic
    epoch-NNNN.pt   periodic copies (train.checkpoint_every)
    encoder.safetensors, backbone_torchvision.pt   exported encoder (end of training)
    metrics.json, metrics.md   end-of-training evaluation on the test split
"""

from __future__ import annotations

import math
import os
import signal
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn

from bayesncl.checkpoint import (  # noqa: F401 - RunDirError is re-exported for callers
    RunDirError,
    TrainState,
    atomic_save,
    prepare_run_dir,
    save_checkpoint,
    seed_everything,
    set_rng_state,
    write_log,
)
from bayesncl.config import Config, ConfigError, config_from_dict, dump_yaml
from bayesncl.data import build_train_loader, dataset_info
from bayesncl.models import ContrastiveModel, build_model, contrastive_loss


class TrainingError(RuntimeError):
    """Training cannot continue (non-finite loss, ...); the message is one line."""


# ----------------------------------------------------------------------------- devices, precision
def resolve_device(name: str) -> torch.device:
    """``auto`` → cuda if available else cpu. Raises ConfigError if CUDA is asked for but absent."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"train.device={name}: no CUDA device is available here; use train.device=cpu")
        idx = int(name.split(":")[1]) if ":" in name else 0
        if idx >= torch.cuda.device_count():
            raise ConfigError(
                f"train.device={name}: only {torch.cuda.device_count()} CUDA device(s) are available"
            )
    return torch.device(name)


def resolve_precision(name: str, device: torch.device) -> torch.dtype | None:
    """Autocast dtype, or None for fp32. ``auto``: fp16 on CUDA (PAPER-NOTES §2), fp32 on CPU."""
    if name == "auto":
        return torch.float16 if device.type == "cuda" else None
    return {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


# ----------------------------------------------------------------------------- optimisation
def warmup_cosine(
    base: float, total_steps: int, warmup_steps: int, start: float = 3e-5, final: float = 0.0
) -> np.ndarray:
    """Per-iteration learning rates: linear warmup ``start → base``, then cosine ``base → final``.

    returns: (total_steps,) float64 array (PAPER-NOTES §2, stepped per iteration).
    """
    warmup_steps = min(warmup_steps, total_steps)
    warm = np.linspace(start, base, warmup_steps, endpoint=False) if warmup_steps else np.zeros(0)
    n = total_steps - warmup_steps
    t = np.arange(n) / max(n, 1)
    cos = final + 0.5 * (base - final) * (1 + np.cos(np.pi * t))
    return np.concatenate([warm, cos])


def _is_bias_or_norm(name: str, p: nn.Parameter) -> bool:
    return p.ndim <= 1 or name.endswith(".bias")


def param_groups(model: ContrastiveModel, cfg: Config) -> list[dict[str, Any]]:
    """Named parameter groups; ``lr_scale`` multiplies the scheduled backbone lr.

    Bias and norm parameters get no weight decay and no LARS adaptation (solo-learn #301). The
    gating head trains at ``method.gate_lr_ratio`` × the backbone lr; the online probe at
    ``train.probe_lr`` relative to the unscaled base lr, without weight decay.
    """
    wd = cfg.train.weight_decay
    buckets: dict[str, list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        part = name.split(".")[0]
        part = part if part in ("gating_head", "classifier") else "encoder"
        kind = "plain" if _is_bias_or_norm(name, p) else "weight"
        buckets.setdefault(f"{part}/{kind}", []).append(p)
    groups = []
    for key, params in buckets.items():
        part, kind = key.split("/")
        scale = {"encoder": 1.0, "gating_head": cfg.method.gate_lr_ratio, "classifier": 0.0}[part]
        g: dict[str, Any] = {"name": key, "params": params, "lr_scale": scale}
        adapt = kind == "weight" and part != "classifier"
        g["weight_decay"] = wd if adapt else 0.0
        g["always_adapt"] = False
        if part == "classifier":
            g["fixed_lr"] = cfg.train.probe_lr
        groups.append(g)
    return groups


def build_optimizer(groups: list[dict[str, Any]], cfg: Config) -> torch.optim.Optimizer:
    """LARS from timm (trust_coeff = eta, trust_clip = clip_lr), or SGD / AdamW.

    timm's LARS adapts only groups with weight decay > 0, which is how bias/norm are excluded.
    """
    t = cfg.train
    if t.optimizer == "lars":
        from timm.optim import Lars

        return Lars(groups, lr=t.base_lr, momentum=t.momentum, trust_coeff=t.lars_eta, trust_clip=t.clip_lr)
    if t.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=t.base_lr, momentum=t.momentum)
    return torch.optim.AdamW(groups, lr=t.base_lr)


def set_lr(optimizer: torch.optim.Optimizer, lr: float, probe_factor: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = g["fixed_lr"] * probe_factor if "fixed_lr" in g else lr * g["lr_scale"]


# ----------------------------------------------------------------------------- the loop
def pretrain(
    cfg: Config,
    run_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    evaluate: bool = True,
) -> dict[str, Any]:
    """Pretrain the method ``cfg`` describes and (optionally) evaluate it on the test split.

    returns: the final metrics dict (also written to ``run_dir/metrics.json``).
    Raises ConfigError / DataError / RunDirError before writing anything when the input is bad;
    TrainingError if the loss becomes non-finite (the last good checkpoint is kept).
    """
    run_dir = Path(run_dir)
    device = resolve_device(cfg.train.device)
    amp_dtype = resolve_precision(cfg.train.precision, device)
    info = dataset_info(cfg.data)
    ckpt = prepare_run_dir(run_dir, cfg, resume=resume, overwrite=overwrite)

    seed_everything(cfg.seed)
    loader = build_train_loader(cfg.data, cfg.train.batch_size, seed=cfg.seed, device=device)
    model = build_model(cfg, info.channels, info.image_size, info.num_classes).to(device)
    if cfg.train.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = build_optimizer(param_groups(model, cfg), cfg)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)

    steps_per_epoch = len(loader)
    total_steps = cfg.train.epochs * steps_per_epoch
    lr_base = cfg.train.base_lr * cfg.train.batch_size / 256
    schedule = warmup_cosine(
        lr_base,
        total_steps,
        round(cfg.train.warmup_epochs * steps_per_epoch),
        start=cfg.train.warmup_start_lr,
        final=cfg.train.min_lr,
    )

    state = TrainState()
    if ckpt is not None:
        model.load_state_dict(ckpt["state_dict"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scaler.load_state_dict(ckpt["scaler"])
        state = TrainState(epoch=ckpt["epoch"], step=ckpt["step"], log=list(ckpt["log"]))
        set_rng_state(ckpt["rng"])
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(dump_yaml(cfg))

    step_model = torch.compile(model) if cfg.train.compile else model
    autocast = torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None else nullcontext()
    interrupted = _install_sigint()
    for epoch in range(state.epoch, cfg.train.epochs):
        loader.set_epoch(epoch)
        model.train()
        t0 = time.time()
        sums = torch.zeros(6, device=device)  # loss, nce, kl, gate_open, all_closed, probe_correct
        n_seen = 0
        bar = _progress(loader, epoch, cfg)
        for x1, x2, y in bar:
            lr = float(schedule[state.step])
            set_lr(optimizer, lr, lr / lr_base if lr_base > 0 else 1.0)
            x = torch.cat([x1, x2])
            if cfg.train.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            with autocast:
                out = step_model(x)
                logits_cls = model.classifier(out.h.detach())
            loss, parts = contrastive_loss(out, cfg.method)
            probe_loss = nn.functional.cross_entropy(logits_cls.float(), torch.cat([y, y]))
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss + probe_loss).backward()
            scaler.step(optimizer)
            scaler.update()

            with torch.no_grad():
                sums += step_stats(loss, parts, out.mask, logits_cls, torch.cat([y, y]))
            n_seen += 1
            state.step += 1
            if device.type == "cpu" or state.step % 25 == 0 or n_seen == steps_per_epoch:
                means = (sums / n_seen).tolist()
                if not math.isfinite(float(loss.detach())):
                    raise TrainingError(
                        f"non-finite loss at step {state.step} (epoch {epoch + 1}): "
                        f"InfoNCE={float(parts['info_nce']):.4g}, KL={float(parts['kl']):.4g}; "
                        f"the last good checkpoint {run_dir / 'last.pt'} is kept"
                    )
                if hasattr(bar, "set_postfix"):
                    post = {"loss": f"{means[0]:.3f}", "kl": f"{means[2]:.2f}"}
                    if out.mask is not None:
                        post["open"] = f"{means[3]:.2f}"
                    bar.set_postfix(post)
            if interrupted["flag"]:
                break
        if interrupted["flag"]:
            save_checkpoint(run_dir / "interrupted.pt", model, optimizer, scaler, state, cfg)
            raise KeyboardInterrupt(
                f"interrupted in epoch {epoch + 1}; state saved to {run_dir / 'interrupted.pt'}"
            )
        means = (sums / max(n_seen, 1)).tolist()
        row = {
            "epoch": epoch + 1,
            "step": state.step,
            "loss": round(means[0], 6),
            "info_nce": round(means[1], 6),
            "kl": round(means[2], 6),
            "gate_open": round(means[3], 6),
            "rho": cfg.method.rho if model.gate is not None else "",
            "rows_all_closed": round(means[4], 6),
            "online_acc": round(100 * means[5], 3),
            "lr": lr,
            "epoch_time_s": round(time.time() - t0, 2),
        }
        state.log.append(row)
        state.epoch = epoch + 1
        if model.gate is not None and means[4] > 0.5:
            print(f"warning: gate collapse: {100 * means[4]:.0f}% of rows have every gate closed")
        write_log(run_dir, state.log)
        save_checkpoint(run_dir / "last.pt", model, optimizer, scaler, state, cfg)
        every = cfg.train.checkpoint_every
        if every and state.epoch % every == 0:
            save_checkpoint(run_dir / f"epoch-{state.epoch:04d}.pt", model, optimizer, scaler, state, cfg)

    export_encoder(model, run_dir)
    if not evaluate:
        return {}
    from bayesncl.evaluation.pipeline import evaluate_model

    return evaluate_model(model, cfg, run_dir, device=device)


def step_stats(
    loss: torch.Tensor,
    parts: dict[str, torch.Tensor],
    mask: torch.Tensor | None,
    class_logits: torch.Tensor,
    y: torch.Tensor,
) -> torch.Tensor:
    """(6,) tensor: loss, InfoNCE, KL, gate-open rate, fraction of rows with every gate closed,
    online-probe accuracy. Stays on the device: no host sync inside the step."""
    one = torch.ones((), device=loss.device)
    open_rate = mask.float().mean() if mask is not None else one
    closed = (mask.sum(1) == 0).float().mean() if mask is not None else 0 * one
    correct = (class_logits.argmax(1) == y).float().mean()
    return torch.stack([loss.detach(), parts["info_nce"], parts["kl"], open_rate, closed, correct])


def export_encoder(model: ContrastiveModel, run_dir: Path) -> None:
    """Write ``encoder.safetensors`` (backbone, projector, gating head) and the backbone alone as a
    torchvision-loadable state dict ``backbone_torchvision.pt`` (load with ``strict=False``: no fc)."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tmp = run_dir / ".encoder.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "bayesncl-encoder-v1"})
    os.replace(tmp, run_dir / "encoder.safetensors")
    atomic_save(
        {k: v.detach().cpu() for k, v in model.backbone.state_dict().items()},
        run_dir / "backbone_torchvision.pt",
    )


def load_run_config(run_dir: Path) -> Config:
    """The resolved config of an existing run dir."""
    return config_from_dict(yaml.safe_load((run_dir / "config.yaml").read_text()))


def _progress(loader: Any, epoch: int, cfg: Config) -> Any:
    if not cfg.train.progress:
        return loader
    from tqdm.auto import tqdm

    return tqdm(
        loader,
        desc=f"{cfg.method.name} epoch {epoch + 1}/{cfg.train.epochs}",
        leave=False,
        dynamic_ncols=True,
    )


def _install_sigint() -> dict[str, bool]:
    """First Ctrl-C: finish the current step, save ``interrupted.pt`` and stop cleanly."""
    flag = {"flag": False}
    try:
        previous = signal.getsignal(signal.SIGINT)

        def handler(signum: int, frame: Any) -> None:
            flag["flag"] = True
            signal.signal(signal.SIGINT, previous)

        signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread
        pass
    return flag
