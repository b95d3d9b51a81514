"""Fast linear probe on precomputed frozen features (protocol: docs/metrics.md, "Fast linear probe").

L-BFGS logistic regression on standardised features, its L2 strength chosen on a stratified
held-out split. This is *not* the paper's probe (:mod:`bayesncl.metrics.paper_probe`); numbers here
are "fast probe on frozen features".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from ._numerics import downscale_exponent, scaled
from .inputs import EvalError, class_indices, validate_train_test
from .retrieval import select_top_dims

__all__ = ["DEFAULT_L2_GRID", "feature_selection_probe", "linear_probe", "probe_columns", "selection_probes",
           "stratified_split"]

DEFAULT_L2_GRID = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5)


def stratified_split(labels: torch.Tensor, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fit_idx, val_idx): per class, round(fraction · n_c) samples held out (at least 1 and at
    most n_c − 1 for classes with 2+ samples; single-sample classes stay in the fit part)."""
    gen = torch.Generator().manual_seed(int(seed))
    fit_parts, val_parts = [], []
    for c in torch.unique(labels):
        idx = torch.nonzero(labels == c).flatten()
        idx = idx[torch.randperm(idx.numel(), generator=gen)]
        n_c = idx.numel()
        n_val = 0 if n_c < 2 else min(n_c - 1, max(1, int(round(fraction * n_c))))
        val_parts.append(idx[:n_val])
        fit_parts.append(idx[n_val:])
    return torch.sort(torch.cat(fit_parts)).values, torch.sort(torch.cat(val_parts)).values


def _standardise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = x.mean(dim=0)
    std = x.std(dim=0, unbiased=False)
    std = torch.where(std > 1e-12, std, torch.ones_like(std))
    return mean, std


# Below this many multiply-adds per evaluation a fit runs on one thread: on a busy machine the
# thread-pool barrier of every tiny parallel op costs milliseconds, which makes a fit on a
# 600 x 16 problem take seconds instead of milliseconds.
_SINGLE_THREAD_WORK = 1 << 23


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    if n >= before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _fit(
    x: torch.Tensor, y: torch.Tensor, num_classes: int, l2: float,
    init: tuple[torch.Tensor, torch.Tensor] | None, max_iter: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Minimise mean CE + ½ l2 ‖W‖² with L-BFGS; W is (C, D), b is (C,).

    The gradient is written out (softmax − one-hot) instead of autograd: autograd's ``xᵀ @ g``
    for a tall-skinny ``g`` takes a BLAS path several times slower than ``(gᵀ @ x)``.
    """
    n, d = x.shape
    if init is None:
        w = torch.zeros(num_classes, d, dtype=x.dtype)
        b = torch.zeros(num_classes, dtype=x.dtype)
    else:
        w, b = init[0].clone(), init[1].clone()
    w.requires_grad_(True)
    b.requires_grad_(True)
    rows = torch.arange(n)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=max_iter, history_size=10, tolerance_grad=1e-5,
                            tolerance_change=1e-9, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        with torch.no_grad():
            logits = torch.addmm(b, x, w.T)
            lse = torch.logsumexp(logits, dim=1)
            loss = (lse - logits[rows, y]).mean() + 0.5 * l2 * (w * w).sum()
            prob = torch.exp(logits - lse[:, None])
            prob[rows, y] -= 1.0
            prob /= n
            w.grad = torch.mm(prob.T, x) + l2 * w
            b.grad = prob.sum(dim=0)
        return loss

    with _threads(1 if n * d * num_classes < _SINGLE_THREAD_WORK else torch.get_num_threads()):
        opt.step(closure)  # type: ignore[arg-type]
    return w.detach(), b.detach()


def _topk_correct(logits: torch.Tensor, y: torch.Tensor, tops: Sequence[int]) -> list[float]:
    pred = torch.topk(logits, max(tops), dim=1).indices
    return [100.0 * float((pred[:, :t] == y[:, None]).any(dim=1).float().mean()) for t in tops]


def _select_l2(
    x: torch.Tensor, y: torch.Tensor, num_classes: int, grid: list[float], val_fraction: float, seed: int,
    max_iter: int,
) -> tuple[float, float]:
    """``(l2, held-out Acc@1)``: the best of ``grid`` (decreasing, each fit warm-started from the
    previous) on a stratified held-out ``val_fraction`` of the train features (steps 1-4)."""
    fit_idx, val_idx = stratified_split(y, val_fraction, seed)
    if val_idx.numel() == 0:
        raise EvalError(
            f"too few train samples per class to hold out a validation split: {y.numel()} "
            f"samples in {num_classes} classes, at most one per class; the L2 strength is chosen "
            "on held-out samples of classes with >= 2"
        )
    mean, std = _standardise(x[fit_idx])
    xf = (x[fit_idx] - mean) / std
    xv = (x[val_idx] - mean) / std
    state = None
    best_l2, best_val = grid[0], -1.0
    for l2 in grid:
        state = _fit(xf, y[fit_idx], num_classes, l2, state, max_iter)
        val_acc = _topk_correct(torch.addmm(state[1], xv, state[0].T), y[val_idx], [1])[0]
        if val_acc > best_val:
            best_val, best_l2 = val_acc, l2
    return best_l2, best_val


def linear_probe(
    train_features: Any, train_labels: Any, test_features: Any, test_labels: Any, *,
    l2_grid: Sequence[float] = DEFAULT_L2_GRID, val_fraction: float = 0.1, seeds: int | Sequence[int] = 0,
    max_iter: int = 100,
) -> dict[str, Any]:
    """Fast linear probe on (N, D) train/test features with (N,) labels; returns percent accuracies.

    Keys: ``acc1``, ``acc5`` (means over ``seeds``, one seed or a sequence), ``acc1_std``,
    ``acc5_std`` (ddof 0; 0 for one seed), ``per_seed`` (list of ``{"seed", "l2", "val_acc1",
    "acc1", "acc5"}``) and ``protocol``. Acc@5 becomes Acc@C when there are fewer than 5 classes.
    A test label absent from the train labels always counts as an error. Raises EvalError for bad
    features or labels, train and test of different D, fewer than 2 classes, an empty or negative
    ``l2_grid``, or (with 2+ L2 strengths) no class with 2 samples to hold out.
    """
    xtr, ytr, xte, yte = validate_train_test(train_features, train_labels, test_features, test_labels,
                                             "linear_probe")
    grid = sorted((float(v) for v in l2_grid), reverse=True)
    if not grid:
        raise EvalError("l2_grid is empty: give at least one non-negative L2 strength, e.g. [1e-3]")
    if not all(0 <= v < float("inf") for v in grid):
        raise EvalError(f"l2_grid must hold finite non-negative values; got {list(l2_grid)}")
    ytr_idx, yte_idx, num_classes = class_indices(ytr, yte)
    if num_classes < 2:
        raise EvalError(f"linear_probe needs at least 2 classes in the train labels; got {num_classes}")
    # Standardisation is invariant to a common scale of train and test: divide huge features by a
    # power of two (exact) so that their float32 squares and sums cannot overflow.
    peak = max(float(xtr.abs().max()), float(xte.abs().max()))
    e = downscale_exponent(peak, xtr.shape[0] + xte.shape[0], torch.float32, power=2)
    xtr = scaled(xtr, e).to(torch.float32)
    xte = scaled(xte, e).to(torch.float32)
    tops = [1, min(5, num_classes)]

    per_seed = []
    for seed in [int(seeds)] if isinstance(seeds, (int, np.integer)) else [int(s) for s in seeds]:
        best_l2, best_val = grid[0], float("nan")
        if len(grid) > 1:
            best_l2, best_val = _select_l2(xtr, ytr_idx, num_classes, grid, val_fraction, seed, max_iter)
        mean, std = _standardise(xtr)
        w, b = _fit((xtr - mean) / std, ytr_idx, num_classes, best_l2, None, max_iter)
        logits = torch.addmm(b, (xte - mean) / std, w.T)
        acc1, acc5 = _topk_correct(logits, yte_idx, tops)
        per_seed.append({"seed": seed, "l2": best_l2, "val_acc1": best_val, "acc1": acc1, "acc5": acc5})

    acc1 = np.array([r["acc1"] for r in per_seed])
    acc5 = np.array([r["acc5"] for r in per_seed])
    return {
        "acc1": float(acc1.mean()), "acc5": float(acc5.mean()), "acc1_std": float(acc1.std()),
        "acc5_std": float(acc5.std()), "per_seed": per_seed,
        "protocol": f"fast probe: standardised frozen features, L-BFGS logistic regression, l2 from "
                    f"{grid} on a {val_fraction:.0%} stratified held-out split, refit on all train",
    }


def feature_selection_probe(
    train_features: Any, train_labels: Any, test_features: Any, test_labels: Any, k: int, **probe_kwargs: Any
) -> dict[str, Any]:
    """Linear probe on the top-``k`` dims ranked by expected activation Σ_n normalize(F)_nk of
    the *train* features (NCL's feature-selection protocol); adds ``k`` and ``dims`` (the selected
    dims in rank order, largest expected activation first) to the :func:`linear_probe` result. The
    probe sees the selected columns in index order (:func:`probe_columns`), so it depends on the
    *set* of dims only: at k = D it is exactly the probe on all features. Raises
    :class:`EvalError` unless ``k`` is an integer with 1 <= k <= D (the feature dimension), and for
    everything :func:`linear_probe` rejects."""
    xtr, _, xte, _ = validate_train_test(train_features, None, test_features, None)
    _check_k(k, xtr.shape[1], "feature_selection_probe")
    idx = select_top_dims(xtr, k)
    out = probe_columns(xtr, train_labels, xte, test_labels, idx, **probe_kwargs)
    return {**out, "k": int(k), "dims": idx.tolist()}


def _check_k(k: Any, d: int, who: str) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= d:
        raise EvalError(
            f"{who}: k={k!r}: expected the number of top dims to keep, an integer with 1 <= k <= D={d}"
        )


def probe_columns(
    train_features: Any, train_labels: Any, test_features: Any, test_labels: Any, columns: Any,
    **probe_kwargs: Any,
) -> dict[str, Any]:
    """:func:`linear_probe` on the feature ``columns`` (a sequence of distinct dim indices) of
    train and test, taken in increasing index order whatever order they are given in: the probe
    is a function of the set of columns (the same set gives bit-identical results, so a top-K and a
    random-K selection that pick the same dims report the same accuracy). Raises
    :class:`EvalError` for an empty, repeated or out-of-range column, and as :func:`linear_probe`."""
    xtr, _, xte, _ = validate_train_test(train_features, None, test_features, None)
    cols = np.asarray(torch.as_tensor(columns).cpu(), dtype=np.int64).ravel()
    d = xtr.shape[1]
    if cols.size == 0 or len(set(cols.tolist())) != cols.size or cols.min() < 0 or cols.max() >= d:
        raise EvalError(f"probe columns must be distinct dims in 0..{d - 1}; got {cols.tolist()}")
    idx = torch.from_numpy(np.sort(cols))
    return linear_probe(xtr[:, idx], train_labels, xte[:, idx], test_labels, **probe_kwargs)


def selection_probes(
    train_features: Any, train_labels: Any, test_features: Any, test_labels: Any, ks: Sequence[int],
    seed: int = 0,
) -> dict[int, dict[str, float]]:
    """NCL's feature-selection comparison (its ``scripts/selected`` probe) at every K of ``ks``:
    ``{K: {"top_acc1": …, "random_acc1": …}}``, percent. ``top_acc1``: the probe on the K dims of
    largest expected activation of the *train* features (:func:`feature_selection_probe`);
    ``random_acc1``: the probe on K dims drawn without replacement by one
    ``numpy.random.default_rng(seed)``, one draw per K in the order of ``ks`` (so a seed and ``ks``
    pick the same dims for any features of width D). Both are :func:`probe_columns` at probe seed
    ``seed``: deterministic given the set of dims, so at K = D (both keep every dim) the two are
    equal. Raises :class:`EvalError` for a K outside 1..D and as :func:`linear_probe`."""
    xtr, _, xte, _ = validate_train_test(train_features, None, test_features, None)
    d = xtr.shape[1]
    for k in ks:
        _check_k(k, d, "selection_probes")
    rng = np.random.default_rng(seed)
    out: dict[int, dict[str, float]] = {}
    for k in ks:
        top = probe_columns(xtr, train_labels, xte, test_labels, select_top_dims(xtr, int(k)), seeds=seed)
        drawn = rng.choice(d, size=int(k), replace=False)
        rand = probe_columns(xtr, train_labels, xte, test_labels, drawn, seeds=seed)
        out[int(k)] = {"top_acc1": top["acc1"], "random_acc1": rand["acc1"]}
    return out
