"""A plain SimCLR training loop, the kind lightly's and torchvision's examples show: the yardstick
``bayesncl benchmark`` measures our training step against (issue 23).

What "plain" means here (lightly 1.6's ``examples/pytorch/simclr.py`` and its ``SimCLRTransform``):

* data: a ``torch.utils.data.Dataset`` of PIL images whose ``__getitem__`` applies a torchvision
  ``Compose`` twice (two views; random resized crop, horizontal flip, colour jitter 0.8/0.8/0.8/0.2
  with p 0.8, grayscale p 0.2, Gaussian blur p 0.5, to tensor, normalise), batched by a
  ``DataLoader`` (shuffle, drop_last; ``num_workers`` workers, persistent);
* model: the same backbone and projector our model builds (so the FLOPs are the same), called once
  per view;
* loss: NT-Xent written out as the examples do (normalise, one similarity matrix over the 2n views,
  the self-similarity masked, cross-entropy to the positive), at our temperature;
* optimiser: SGD with momentum 0.9 (lr 0.06, weight decay 5e-4, lightly's example); fp32, no
  autocast, default memory format.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bayesncl.config import Config

__all__ = ["PlainPairs", "nt_xent", "plain_trainer", "plain_transform"]


def nt_xent(z0: torch.Tensor, z1: torch.Tensor, temperature: float) -> torch.Tensor:
    """NT-Xent of two (n, D) batches of views (row i of each: a positive pair): mean over the 2n
    rows of ``−log(exp(s_i,pos/T) / Σ_{j≠i} exp(s_ij/T))``, s the cosine similarity (SimCLR, Chen
    et al. 2020, eq. 1). Returns a 0-d tensor (nats)."""
    z = F.normalize(torch.cat([z0, z1]), dim=1)
    n = z0.shape[0]
    logits = z @ z.T / temperature
    logits.fill_diagonal_(float("-inf"))
    target = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    return F.cross_entropy(logits, target)


def plain_transform(size: int, mean: tuple[float, ...], std: tuple[float, ...]) -> Any:
    """lightly's ``SimCLRTransform`` at ``size`` px in torchvision (v1) transforms: PIL image →
    normalised float (C, size, size)."""
    from torchvision import transforms as T

    kernel = max(3, int(0.1 * size) // 2 * 2 + 1)  # odd, ~10 % of the side
    return T.Compose([
        T.RandomResizedCrop(size, scale=(0.08, 1.0)),
        T.RandomHorizontalFlip(),
        T.RandomApply([T.ColorJitter(0.8, 0.8, 0.8, 0.2)], p=0.8),
        T.RandomGrayscale(p=0.2),
        T.RandomApply([T.GaussianBlur(kernel, sigma=(0.1, 2.0))], p=0.5),
        T.ToTensor(),
        T.Normalize(list(mean), list(std)),
    ])


class PlainPairs(torch.utils.data.Dataset):
    """Two views of each uint8 (N, C, H, W) image, made per sample by ``transform`` on a PIL image."""

    def __init__(self, images: torch.Tensor, transform: Callable[[Any], torch.Tensor]) -> None:
        self.images, self.transform = images, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        from PIL import Image

        a = self.images[i].numpy()
        img = Image.fromarray(a[0], "L") if a.shape[0] == 1 else Image.fromarray(a.transpose(1, 2, 0), "RGB")
        return self.transform(img), self.transform(img)


def _endless(loader: torch.utils.data.DataLoader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    while True:
        yield from loader


def plain_trainer(
    cfg: Config, device: torch.device, workers: tuple[int, ...] = (0, 1, 2)
) -> dict[int, Callable[[], None]]:
    """``{num_workers: step}``: one plain SimCLR step (see the module doc) of ONE model, from a
    DataLoader with that many workers, on the training split of ``cfg.data`` at ``cfg``'s batch
    size. Every loader trains the same model and optimiser (only the data path differs)."""
    from bayesncl.core.model import build_model
    from bayesncl.data import dataset_info
    from bayesncl.data.sources import load_split

    info = dataset_info(cfg.data)
    images = load_split(cfg.data, "train").images
    if images is None:
        raise ValueError("plain_trainer needs a tensor dataset (e.g. data.name=synthetic)")
    torch.manual_seed(0)
    ours = build_model(cfg, info.channels, info.image_size, info.num_classes)
    model = nn.Sequential(ours.backbone, ours.projector).to(device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.06, momentum=0.9, weight_decay=5e-4)
    pairs = PlainPairs(images, plain_transform(info.image_size, info.mean, info.std))
    temperature = cfg.method.temperature

    def step_of(batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> Callable[[], None]:
        def step() -> None:
            x0, x1 = next(batches)
            x0, x1 = x0.to(device, non_blocking=True), x1.to(device, non_blocking=True)
            loss = nt_xent(model(x0), model(x1), temperature)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        return step

    steps = {}
    for w in workers:
        loader = torch.utils.data.DataLoader(
            pairs, batch_size=cfg.train.batch_size, shuffle=True, drop_last=True, num_workers=w,
            persistent_workers=w > 0, pin_memory=device.type == "cuda",
        )
        steps[w] = step_of(_endless(loader))
    return steps
