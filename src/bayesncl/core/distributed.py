"""Processes and devices: PyTorch DDP launched by ``torchrun`` (no launcher of our own).

:func:`setup` joins torchrun's process group (NCCL on CUDA, gloo on CPU; a no-op without torchrun's
variables or with ``WORLD_SIZE=1``); :func:`gather_with_grad` gives InfoNCE every rank's negatives,
its backward summing over ranks while DDP averages, so no extra ``1/world_size`` is needed or
allowed. What each rank does and why the gradient is right: docs/scaling.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from bayesncl.core.seeding import mix_seed

__all__ = [
    "DistributedError", "World", "all_reduce_mean", "check_sync_bn", "convert_sync_bn", "gather_with_grad",
    "is_distributed", "is_main_process", "local_main_first", "rank_seed", "resolve_device", "run_on_main",
    "scaled_lr", "setup", "split_batch"
]

T = TypeVar("T")


class DistributedError(ValueError):
    """The processes, devices or batch cannot work together as asked; the message is one line."""


# ----------------------------------------------------------------------------- devices
def resolve_device(name: str, what: str = "train.device") -> torch.device:
    """``auto`` → cuda if available else cpu; ``name`` is one config already checked (auto, cpu, cuda,
    cuda:N). Raises DistributedError if CUDA is asked for but absent; ``what`` names the setting."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DistributedError(f"{what}={name}: no CUDA device is available here; use {what}=cpu")
        idx = int(name.split(":")[1]) if ":" in name else 0
        if idx >= torch.cuda.device_count():
            n = torch.cuda.device_count()
            raise DistributedError(f"{what}={name}: only {n} CUDA device(s) are available")
    return torch.device(name)


def _env_int(name: str, default: int | None = None) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise DistributedError(f"environment variable {name}={raw!r}: expected an integer") from None


def _launch_env() -> tuple[int, int, int, int]:
    """``(rank, world_size, local_rank, local_world_size)`` from torchrun's environment."""
    world_size = _env_int("WORLD_SIZE", 1) or 1
    rank = _env_int("RANK", 0 if world_size == 1 else None)
    if rank is None:
        raise DistributedError(
            f"WORLD_SIZE={world_size} but RANK is not set; launch with torchrun (see docs/scaling.md)"
        )
    local_rank = _env_int("LOCAL_RANK", rank) or 0
    local_world = _env_int("LOCAL_WORLD_SIZE", None) or 0
    if world_size < 1 or not 0 <= rank < world_size:
        raise DistributedError(f"RANK={rank}, WORLD_SIZE={world_size}: expected 0 <= RANK < WORLD_SIZE")
    return rank, world_size, local_rank, local_world


def _process_device(name: str, local_rank: int, local_world: int) -> torch.device:
    """The device of one process among several on a node: ``cuda:LOCAL_RANK`` or ``cpu``."""
    if name.startswith("cuda:"):
        raise DistributedError(
            f"train.device={name} pins every process to one GPU; under torchrun use train.device=cuda "
            "or auto (process LOCAL_RANK takes cuda:LOCAL_RANK)"
        )
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DistributedError(f"train.device={name}: no CUDA device is available here; use train.device=cpu")
    visible = torch.cuda.device_count()
    procs = max(local_world, local_rank + 1)
    if procs > visible:
        raise DistributedError(
            f"{procs} processes on this node but only {visible} CUDA device(s) are visible: launch "
            f"torchrun with --nproc_per_node={visible} (one process per GPU), or use train.device=cpu"
        )
    return torch.device("cuda", local_rank)


# ----------------------------------------------------------------------------- the process group
@dataclass
class World:
    """This process's place in the run. ``owns_group``: :func:`setup` created the process group
    (and :meth:`close` destroys it); False when there is none or a caller made it."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def close(self) -> None:
        if self.owns_group and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        self.owns_group = False


def setup(device_name: str = "auto") -> World:
    """Join torchrun's process group and choose this process's device: a single process on
    :func:`resolve_device` without torchrun variables or with ``WORLD_SIZE=1``; an existing group (a
    test harness, a notebook) as is; else ``init_process_group`` (NCCL on CUDA, gloo on CPU, env://).

    Raises DistributedError (one line) for more processes than visible GPUs on a node,
    ``train.device=cuda:N`` with several processes, malformed torchrun variables or absent CUDA.
    """
    existing = dist.is_available() and dist.is_initialized()
    if existing:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        local_rank, local_world = _env_int("LOCAL_RANK", rank) or 0, _env_int("LOCAL_WORLD_SIZE", 0) or 0
    else:
        rank, world_size, local_rank, local_world = _launch_env()
    if world_size == 1:
        return World(0, 1, 0, resolve_device(device_name))
    if not dist.is_available():
        raise DistributedError(f"WORLD_SIZE={world_size}, but this PyTorch build has no torch.distributed")
    device = _process_device(device_name, local_rank, local_world)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if existing:
        return World(rank, world_size, local_rank, device)
    if device.type == "cuda":
        dist.init_process_group("nccl", init_method="env://", device_id=device)
    else:
        dist.init_process_group("gloo", init_method="env://")
    return World(rank, world_size, local_rank, device, owns_group=True)


def is_distributed() -> bool:
    """True inside a process group of more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def is_main_process() -> bool:
    """Rank 0 of the process group, or of torchrun's ``RANK`` before the group exists."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return (_env_int("RANK", 0) or 0) == 0


# ----------------------------------------------------------------------------- collectives
def gather_with_grad(x: Tensor) -> Tensor:
    """Concatenate ``x`` from every rank along dim 0, in rank order, *with* gradient.

    x: (m, ...) with the same shape on every rank. Returns (world_size·m, ...); rows
    ``[rank·m, (rank+1)·m)`` are this rank's ``x``. The backward sums the incoming gradients over
    ranks and returns this rank's slice, so other ranks' use of our rows as negatives reaches our
    parameters (a plain ``dist.all_gather`` would cut that path). Single process: returns ``x``.
    torch's ``all_gather_single_autograd`` where it exists, else ``distributed.nn.functional.all_gather``.
    """
    if not is_distributed():
        return x
    try:
        from torch.distributed._functional_collectives import all_gather_single_autograd
    except ImportError:  # older torch
        from torch.distributed.nn.functional import all_gather

        return torch.cat(all_gather(x.contiguous()), dim=0)
    return all_gather_single_autograd(x.contiguous(), 0, dist.group.WORLD)


def all_reduce_mean(x: Any) -> Any:
    """The mean of ``x`` over ranks (a new tensor; no gradient: for logging and checks only); ``x``
    a tensor, or a dict of 0-d tensors (named statistics: one all-reduce of them stacked)."""
    if isinstance(x, dict):
        if not x:
            return {}
        return dict(zip(x, all_reduce_mean(torch.stack(list(x.values()))), strict=True))
    if not is_distributed():
        return x
    y = x.detach().clone()
    dist.all_reduce(y, op=dist.ReduceOp.SUM)
    return y / dist.get_world_size()


def all_gather_objects(obj: T) -> list[T] | None:
    """Every rank's ``obj`` (picklable), in rank order, on every rank; None for a single process.
    Used to store each rank's RNG state in the checkpoint (bit-identical resume of random gates)."""
    if not is_distributed():
        return None
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def run_on_main(fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0 only and hand its result, or the exception it raised, to every rank
    (pickled, ``broadcast_object_list``), so no rank is left waiting in a collective (the run-dir
    checks, the resume checkpoint). Single process: ``fn()``."""
    if not is_distributed():
        return fn()
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", fn())
        except Exception as e:  # noqa: BLE001 - re-raised on every rank below
            box[0] = ("error", e)
    dist.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if kind == "error":
        raise value
    return value


def local_main_first(world: World, fn: Callable[[], T]) -> T:
    """Run ``fn`` on each node's local rank 0 first, then on the node's other ranks (one download
    per node for ``data.download=true``). The barrier is passed even if ``fn`` raises, so the other
    ranks go on (and meet the same error). Single process: ``fn()``."""
    if not world.distributed or not is_distributed():
        return fn()
    if world.local_rank == 0:
        try:
            return fn()
        finally:
            dist.barrier()
    dist.barrier()
    return fn()


# ----------------------------------------------------------------------------- small rules
def rank_seed(seed: int, rank: int) -> int:
    """This rank's seed for the global RNGs (model init is broadcast by DDP anyway; the RNG then
    drives e.g. the Gumbel noise). Rank 0 keeps ``seed``, so a single process is unchanged."""
    return int(seed) if rank == 0 else mix_seed(seed, rank, 0xD15EED)


def scaled_lr(base_lr: float, global_batch: int) -> float:
    """Linear scaling rule: ``base_lr × global_batch / 256`` with ``global_batch =
    train.batch_size × world_size`` (PAPER-NOTES §2)."""
    return base_lr * global_batch / 256


def split_batch(global_batch: int, world_size: int) -> int:
    """Per-process batch of a global batch. Raises DistributedError unless ``global_batch`` is a
    multiple of ``world_size`` and leaves each process at least 2 images (InfoNCE, BatchNorm)."""
    if global_batch % world_size:
        raise DistributedError(
            f"global batch {global_batch} is not divisible by {world_size} processes: use a multiple "
            f"of {world_size} (train.batch_size is per process: {global_batch // world_size or 1} "
            f"gives {(global_batch // world_size or 1) * world_size})"
        )
    per = global_batch // world_size
    if per < 2:
        raise DistributedError(
            f"global batch {global_batch} over {world_size} processes leaves {per} image per process; "
            "InfoNCE and BatchNorm need >= 2"
        )
    return per


def check_sync_bn(sync_bn: bool, world: World) -> None:
    """``train.sync_bn=true`` needs CUDA when there are several processes: torch's SyncBatchNorm
    has no CPU implementation. With one process it is a no-op (plain BatchNorm already sees the
    whole batch). Raises DistributedError on CPU with several processes."""
    if sync_bn and world.distributed and world.device.type != "cuda":
        raise DistributedError(
            "train.sync_bn=true: torch's SyncBatchNorm runs on CUDA only, and this run uses "
            f"{world.world_size} CPU processes; set train.sync_bn=false (BatchNorm statistics per process)"
        )


def convert_sync_bn(model: nn.Module, sync_bn: bool, world: World) -> nn.Module:
    """Swap every BatchNorm for SyncBatchNorm (same parameters and state-dict keys) when asked and
    there are several processes; otherwise return ``model`` unchanged."""
    check_sync_bn(sync_bn, world)
    if sync_bn and world.distributed:
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model
