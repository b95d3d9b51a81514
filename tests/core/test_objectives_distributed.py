"""The gathered losses of bayesncl.core.losses (InfoNCE, with and without dataset indices, spectral,
SupCon): 2 gloo processes on CPU against 1 process over the concatenated batch (the pattern of
tests/core/test_distributed.py, at the level of the loss functions).

Each process runs a tiny linear model (identical seeded weights) on its half of the images, gathers
the features with :func:`bayesncl.core.distributed.gather_with_grad` (and the labels plainly), takes
the loss of its own rows against every process's rows, backpropagates and averages the gradients
as DDP does. Loss and gradients must equal the one-process run on all images. Guarded bugs
(STYLE.md): negatives from the local rank only, SupCon positives that live on another rank, a
wrong own-pair mask on rank 1, a gradient off by 1/world_size.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn

from bayesncl.core import distributed
from bayesncl.core.losses import (
    global_info_nce,
    global_spectral_loss,
    global_supcon_loss,
    info_nce,
    spectral_loss,
    supcon_loss,
)

from ..conftest import GLOO_TIMEOUT, gloo_group, spawn

WORLD = 2
IMAGES = 8  # 4 per process
LABELS = [0, 1, 2, 0, 1, 2, 0, 1]  # every class on both ranks: SupCon needs the other rank's positives
Loss = Callable[[Tensor, Tensor], Tensor]
Phi = Callable[[Tensor], Tensor]
NO_PHI = nn.Identity()
CASES: dict[str, tuple[Phi, Loss, Loss]] = {
    # name: (φ on the model output, the library's gathering loss, the same loss on local rows only)
    "spectral": (NO_PHI, lambda z, _: global_spectral_loss(z, 0.5), lambda z, _: spectral_loss(z, 0.5)),
    "supcon": (NO_PHI, lambda z, y: global_supcon_loss(z, y, 0.2), lambda z, y: supcon_loss(z, y, 0.2)),
}
CASES["info_nce"] = (NO_PHI, lambda z, _: global_info_nce(z, 0.2), lambda z, _: info_nce(z, 0.2))
CASES["info_nce-index"] = (  # labels as dataset indices: one repeated on the other rank is a positive
    NO_PHI, lambda z, y: global_info_nce(z, 0.2, index=y), lambda z, y: info_nce(z, 0.2, index=y))
CASES["spectral-relu"] = (torch.relu, *CASES["spectral"][1:])  # the NCL versions: φ = ReLU
CASES["supcon-relu"] = (torch.relu, *CASES["supcon"][1:])


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 5))


def _data() -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(IMAGES, 6, generator=g), torch.randn(IMAGES, 6, generator=g), torch.tensor(LABELS)


def _grads(model: nn.Module) -> dict[str, Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _worker(rank: int, out: str) -> None:
    torch.set_num_threads(1)
    with gloo_group(rank, WORLD, Path(out) / "store"):
        n = IMAGES // WORLD
        x1, x2, y = (t[rank * n : (rank + 1) * n] for t in _data())
        labels = torch.cat([y, y])
        report: dict[str, Any] = {}
        for name, (phi, global_loss, local_loss) in CASES.items():
            for gather in (True, False):
                model = _model()
                z = phi(model(torch.cat([x1, x2])))
                loss = (global_loss if gather else local_loss)(z, labels)
                loss.backward()
                grads = _grads(model)
                for g in grads.values():  # what DDP does: average over ranks
                    dist.all_reduce(g)
                    g /= WORLD
                report[name if gather else f"{name}-local"] = {
                    "loss": distributed.all_reduce_mean(loss.detach()), "grads": grads,
                }
        torch.save(report, Path(out) / f"rank{rank}.pt")


def _single(name: str) -> dict[str, Any]:
    x1, x2, y = _data()
    model = _model()
    phi, _, local_loss = CASES[name]  # one process: the local rows are the whole batch
    loss = local_loss(phi(model(torch.cat([x1, x2]))), torch.cat([y, y]))
    loss.backward()
    return {"loss": loss.detach(), "grads": _grads(model)}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("ddp-objectives")
    spawn(_worker, (str(out),), nprocs=WORLD, timeout=GLOO_TIMEOUT + 60, what="write rank<r>.pt")
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


@pytest.mark.integration
@pytest.mark.parametrize("name", list(CASES))
def test_two_gloo_processes_match_one_process(reports: list[dict[str, Any]], name: str) -> None:
    ref = _single(name)
    for rank, report in enumerate(reports):
        got = report[name]
        torch.testing.assert_close(got["loss"], ref["loss"], atol=1e-6, rtol=0)
        assert got["grads"].keys() == ref["grads"].keys()
        for key, g in ref["grads"].items():
            torch.testing.assert_close(got["grads"][key], g, atol=1e-6, rtol=0, msg=f"rank {rank}: {key}")


@pytest.mark.integration
@pytest.mark.parametrize("name", list(CASES))
def test_local_rows_alone_do_not_match(reports: list[dict[str, Any]], name: str) -> None:
    """The test above can fail: without the other rank's negatives (and, for SupCon, positives)
    the loss and the gradients differ."""
    ref = _single(name)
    got = reports[0][f"{name}-local"]
    assert abs(float(got["loss"]) - float(ref["loss"])) > 1e-3
    worst = max(float((g - ref["grads"][k]).abs().max()) for k, g in got["grads"].items())
    assert worst > 1e-4
