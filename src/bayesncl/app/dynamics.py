"""Gradient dynamics (BayesNCL paper Table 3): how activation frequency, gradient variance and
semantic consistency of each feature dimension relate, checkpoint by checkpoint.

Protocol (the paper gives none; this is ours, also in docs/metrics.md):

- For each periodic checkpoint ``epoch-NNNN.pt`` of a run (``train.checkpoint_every``; the
  paper looks every 10 epochs), with the model in eval mode (no BatchNorm statistics change):
- **AF_k** (activation frequency): fraction of *test* samples with z̃_k > 0, z̃ the evaluation
  features of PAPER-NOTES §3.
- **GV_k** (gradient variance): variance over samples of ∂L/∂z_k, L the training loss
  (InfoNCE + λ·KL) on two augmented views of the first ``samples`` *train* images (epoch-0
  augmentation, batches of ``train.batch_size``; whole batches, so ``samples`` is rounded up to a
  multiple of the batch size, and at most one epoch of the train split is used), z the
  non-negative projector output. The loss is a mean over the 2B rows, so each row's gradient is
  rescaled by 2B (per-sample gradients).
- **SC_k**: per-dimension semantic consistency on the test features (``bayesncl.metrics``).
- Spearman correlations AF–GV, GV–SC and AF–SC over the dims where all three are defined (dims
  that fire on the test split).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

from bayesncl.config import Config
from bayesncl.metrics.dynamics import dynamics_correlations, gradient_variance


def checkpoint_epochs(run_dir: Path) -> list[tuple[int, Path]]:
    """Periodic checkpoints ``epoch-NNNN.pt`` of a run, sorted by epoch."""
    found = ((re.fullmatch(r"epoch-(\d+)\.pt", p.name), p) for p in run_dir.glob("epoch-*.pt"))
    return sorted((int(m.group(1)), p) for m, p in found if m)


CORRELATIONS = ("AF-GV", "GV-SC", "AF-SC")


def checkpoint_dynamics(
    path: Path, samples: int = 1024, overrides: list[str] | None = None
) -> tuple[dict[str, Any], Config, int]:
    """The correlations of one checkpoint (the module's protocol): ``AF-GV``, ``GV-SC``, ``AF-SC``,
    ``dims`` and the means ``mean_AF``, ``mean_GV``; with the run's Config and the train images the
    gradient variance used. ``overrides``: ``data.*``/``eval.*`` set on the checkpoint's config before
    the data is read (``reproduce``: its ``data.root``, :func:`bayesncl.paper.variants.measure_overrides`)."""
    from bayesncl.app.evaluate import extract_split, load_trained
    from bayesncl.data import build_train_loader
    from bayesncl.metrics.semantic import semantic_consistency_per_dim

    model, cfg, _ = load_trained(path, overrides=overrides)
    device = next(model.parameters()).device
    test = extract_split(model, cfg, "test", device, keys=("features",))
    f = test["features"]
    af = (f > 0).mean(0)
    loader = build_train_loader(cfg.data, min(cfg.train.batch_size, samples), seed=cfg.seed, device=device)
    loader.set_epoch(0)
    gv, used = gradient_variance(model, loader, cfg, samples)
    corr = dynamics_correlations(af, gv, semantic_consistency_per_dim(f, test["labels"]))
    return {**corr, "mean_AF": float(af.mean()), "mean_GV": float(gv.mean())}, cfg, used


def dynamics_command(
    run_dir: str | Path, *, samples: int = 1024, every: int = 1, epochs: Collection[int] | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """``bayesncl dynamics RUN_DIR``: the Table 3 correlations for every ``every``-th periodic
    checkpoint (of ``epochs`` only, if given: ``reproduce 3``; ``overrides`` as for
    :func:`checkpoint_dynamics`); writes ``dynamics.json`` (with the
    ``samples`` actually used, whole batches capped at one epoch, ``every`` and the checkpoints),
    ``dynamics.md`` and ``dynamics.png`` into the run dir.
    Raises EvalError if ``run_dir`` is a file, missing, or has no periodic checkpoints (of ``epochs``).
    """
    from bayesncl.app.report import write_results
    from bayesncl.metrics.inputs import EvalError

    run = Path(run_dir)
    if run.is_file():
        raise EvalError(
            f"{run} is a file: dynamics expects a run dir (the folder holding its epoch-NNNN.pt checkpoints)"
        )
    if not run.is_dir():
        raise EvalError(f"{run}: no such run dir")
    found = [(e, p) for e, p in checkpoint_epochs(run) if epochs is None or e in epochs]
    ckpts = found[:: max(every, 1)]
    if not ckpts:
        from bayesncl.runs.lock import set_aside_hint

        raise EvalError(
            f"{run} holds no periodic checkpoints epoch-NNNN.pt (train.checkpoint_every > 0)"
            + set_aside_hint(run)
        )
    rows: list[dict[str, Any]] = []
    for epoch, path in ckpts:
        corr, cfg, used = checkpoint_dynamics(path, samples, overrides)
        rows.append({"epoch": epoch, **corr})
        print(f"epoch {epoch}: " + ", ".join(f"{k}={v:.3f}" for k, v in corr.items() if k in CORRELATIONS))
    md = "| epoch | AF–GV | GV–SC | AF–SC | dims |\n|---:|---:|---:|---:|---:|" + "".join(
        f"\n| {r['epoch']} | {r['AF-GV']:.3f} | {r['GV-SC']:.3f} | {r['AF-SC']:.3f} | {r['dims']} |"
        for r in rows
    )
    result = {
        "protocol": __doc__.split("Protocol")[1].strip() if __doc__ else "",
        "samples": used,  # train images the gradient variance used (--samples, capped by the split)
        "every": every,  # every N-th periodic checkpoint (--every)
        "checkpoints": [path.name for _, path in ckpts],
        "rows": rows,
    }
    write_results(
        run, "dynamics", result, md, header="Gradient dynamics: Spearman correlations per checkpoint"
    )
    from bayesncl.app.report.figures import run_label

    _plot(rows, run / "dynamics.png", run_label(cfg.method.name, run.resolve(), cfg.seed))
    print(md)
    return result


DYNAMICS_LABELS = {
    "AF-GV": "activation frequency vs gradient variance",
    "GV-SC": "gradient variance vs semantic consistency",
    "AF-SC": "activation frequency vs semantic consistency",
}


def _plot(rows: list[dict[str, Any]], path: Path, label: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from bayesncl.app.report.figures import save_figure

    fig, ax = plt.subplots(figsize=(6, 3.6))
    epochs = [r["epoch"] for r in rows]
    for key, text in DYNAMICS_LABELS.items():
        ax.plot(epochs, [r[key] for r in rows], marker="o", label=f"{key}: {text}")
    ax.axhline(0, color="gray", lw=0.5)
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("Spearman rank correlation")  # (not ρ: that is the gate's prior)
    ax.set_ylim(-1.05, 1.05)
    ax.set_title("Gradient dynamics per dimension" + (f"\n{label}" if label else ""), fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
