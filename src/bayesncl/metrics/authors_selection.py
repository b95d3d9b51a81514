"""The NCL authors' selected-dims probe (``scripts/selected/simclr.yaml`` with ``selected_dims``,
``solo/methods/linear.py`` of PKU-ML/non_neg), on precomputed projector outputs p; the form behind the
NCL paper's feature-selection table (docs/metrics.md, "Selected-dims probe, the authors' form";
docs/paper-notes.md N11). :func:`bayesncl.metrics.selection_probes` is our fast form.

Their rule, as their code runs it: the classifier nn.Linear(K, C) reads the raw projector output p
(before φ); in the first epoch it reads dims 0..K−1; at the end of that epoch the dims are ranked by
their *expected activation*, the column sums of normalize(relu(p)) over the epoch's train features,
and from the second epoch on it reads the top K of that ranking (the same weights go on). SGD, lr 1.0,
momentum 0, weight decay 0, batch 128 (shuffled, the last partial batch dropped), 50 epochs,
cross-entropy; its step schedule (×0.1 at epochs 60 and 80) does not act within 50 epochs.
Ours differs in one respect: p is of the un-augmented train images, computed once (theirs: crops and
flips, a new draw every epoch), so the probe runs on CPU in seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .inputs import EvalError, validate_train_test

__all__ = ["AUTHORS_PROBE", "authors_selection_probe", "authors_selection_probes", "expected_activation_rank"]

#: The authors' probe settings (scripts/selected/simclr.yaml; solo-learn's SGD defaults).
AUTHORS_PROBE = {"lr": 1.0, "batch_size": 128, "epochs": 50, "weight_decay": 0.0, "momentum": 0.0,
                 "milestones": (60, 80)}  # fmt: skip


def expected_activation_rank(p: Any) -> np.ndarray:
    """Dims of p (N, D) in decreasing order of Σ_n normalize(relu(p))_n,i (ties: lower index), the
    authors' ranking (their ``training_epoch_end``). (D,) int64."""
    x = torch.as_tensor(np.asarray(p), dtype=torch.float32)
    score = F.normalize(F.relu(x), dim=1).sum(dim=0).numpy()
    return np.argsort(-score, kind="stable")


def authors_selection_probe(
    train_p: Any, train_labels: Any, test_p: Any, test_labels: Any, k: int, *,
    dims: Sequence[int] | None = None, seed: int = 0, epochs: int = 50, lr: float = 1.0,
    batch_size: int = 128,
) -> dict[str, Any]:
    """The authors' probe on K dims of p: ``{"acc1", "acc5", "dims"}`` (test accuracy in %, the dims
    read in the last epoch). ``dims=None``: their top-K rule (dims 0..K−1 in epoch 1, then the top K by
    :func:`expected_activation_rank` of the train p); else these K dims in every epoch (the random-K
    comparison). ``seed`` fixes the classifier's init and the batch order; fewer train samples than
    ``batch_size``: one batch of all of them. Raises EvalError for K outside 1..D, ``dims`` of another
    length, or bad inputs."""
    who = "authors_selection_probe"
    xtr, ytr, xte, yte = validate_train_test(train_p, train_labels, test_p, test_labels, who)
    assert ytr is not None and yte is not None
    n, d = xtr.shape
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= d:
        raise EvalError(f"authors_selection_probe: k={k!r}: expected an integer with 1 <= k <= D={d}")
    if dims is not None and len(dims) != k:
        raise EvalError(f"authors_selection_probe: {len(dims)} dims given for k={k}")
    batch_size = min(batch_size, n)  # a train split smaller than a batch: one step an epoch on all of it
    xtr, xte = xtr.float(), xte.float()
    classes = int(max(int(ytr.max()), int(yte.max()))) + 1
    gen = torch.Generator().manual_seed(int(seed))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        clf = torch.nn.Linear(int(k), classes)
    opt = torch.optim.SGD(clf.parameters(), lr=lr, momentum=AUTHORS_PROBE["momentum"],
                          weight_decay=AUTHORS_PROBE["weight_decay"])  # fmt: skip
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, list(AUTHORS_PROBE["milestones"]), gamma=0.1)
    cols = torch.arange(int(k)) if dims is None else torch.as_tensor(list(dims), dtype=torch.long)
    for epoch in range(epochs):
        order = torch.randperm(n, generator=gen)
        for i in range(0, n - batch_size + 1, batch_size):  # drop_last, as their train loader
            idx = order[i : i + batch_size]
            loss = F.cross_entropy(clf(xtr[idx][:, cols]), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
        if epoch == 0 and dims is None:
            cols = torch.from_numpy(expected_activation_rank(xtr.numpy())[: int(k)].copy())
    with torch.no_grad():
        logits = clf(xte[:, cols])
    top = logits.topk(min(5, classes), dim=1).indices
    acc1 = float((top[:, 0] == yte).float().mean()) * 100
    acc5 = float((top == yte[:, None]).any(dim=1).float().mean()) * 100
    return {"acc1": acc1, "acc5": acc5, "dims": cols.tolist()}


def authors_selection_probes(
    train_p: Any, train_labels: Any, test_p: Any, test_labels: Any, ks: Sequence[int], seed: int = 0,
    epochs: int = 50,
) -> dict[int, dict[str, float]]:
    """:func:`authors_selection_probe` at every K of ``ks``: ``{K: {"top_acc1", "random_acc1"}}``, %;
    the random K drawn as :func:`bayesncl.metrics.selection_probes` draws them (one
    ``numpy.random.default_rng(seed)``, one draw per K in the order of ``ks``)."""
    d = np.asarray(train_p).shape[1]
    rng = np.random.default_rng(seed)
    out: dict[int, dict[str, float]] = {}
    for k in ks:
        args = (train_p, train_labels, test_p, test_labels, k)
        top = authors_selection_probe(*args, seed=seed, epochs=epochs)  # (checks k first)
        drawn = rng.choice(d, size=int(k), replace=False).tolist()
        rand = authors_selection_probe(*args, dims=drawn, seed=seed, epochs=epochs)
        out[int(k)] = {"top_acc1": top["acc1"], "random_acc1": rand["acc1"]}
    return out
