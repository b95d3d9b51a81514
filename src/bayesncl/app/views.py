"""Features of augmented views of the same images: the input of SEPIN about the input x
(:func:`bayesncl.metrics.sepin_input_scores`; docs/metrics.md, "SEPIN@k")."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import torch

from bayesncl.config import Config
from bayesncl.core.model import ContrastiveModel
from bayesncl.core.optim import extraction_precision
from bayesncl.data import DatasetInfo, build_train_loader, dataset_info
from bayesncl.metrics.inputs import EvalError

#: How many images SEPIN about the input reads by default (two views each).
SEPIN_IMAGES = 10000


def extract_views(
    model: ContrastiveModel, cfg: Config, device: torch.device, n_images: int = SEPIN_IMAGES, *,
    seed: int | None = None, info: DatasetInfo | None = None,
) -> np.ndarray:
    """(N, 2, D) float32 evaluation features z̃ of the two training augmentations (the run's
    ``data.*`` augmentation, :func:`bayesncl.data.build_train_loader`) of N = min(``n_images``,
    whole batches of the train split) images, in the order of epoch 0 of a pass seeded by ``seed``
    (default: the run's), the model in eval mode (BatchNorm's running statistics). A gated run's z̃ is
    gated as ``eval.use_soft_gating`` says, as :func:`bayesncl.app.evaluate.extract_split` does.
    Raises EvalError for ``n_images`` < 2 and DataError for unreadable data."""
    if n_images < 2:
        raise EvalError(f"SEPIN about the input needs at least 2 images; got {n_images}")
    info = info or dataset_info(cfg.data)
    batch = max(2, min(cfg.eval.batch_size, n_images, info.num_train))
    loader = build_train_loader(cfg.data, batch, seed=cfg.seed if seed is None else seed, device=device,
                                info=info)  # fmt: skip
    loader.set_epoch(0)
    precision = extraction_precision(cfg.train.precision, device)
    amp = precision.dtype if precision is not None else None
    channels_last = precision is not None and precision.channels_last
    was_training, soft = model.training, model.soft_eval_gate
    model.eval()
    model.soft_eval_gate = cfg.eval.use_soft_gating
    out: list[np.ndarray] = []
    taken = 0
    try:
        with torch.no_grad():
            for x1, x2, _ in loader:
                pair = []
                for x in (x1, x2):
                    x = x.to(device, non_blocking=True)
                    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
                    with torch.autocast(device.type, dtype=amp) if amp is not None else nullcontext():
                        pair.append(model(x).z_tilde.float().cpu().numpy())
                out.append(np.stack(pair, axis=1))
                taken += len(x1)
                if taken >= n_images:
                    break
    finally:
        model.train(was_training)
        model.soft_eval_gate = soft
    return np.concatenate(out)[:n_images]
