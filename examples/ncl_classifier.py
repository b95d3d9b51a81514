"""NCL with a linear classifier trained beside InfoNCE: a method from a user's file with its own ``Head``.

The loss is InfoNCE(z̃, τ) + γ·CE(W·sg(z), y) (``method.cls_weight`` = γ): a classifier of its own
(``heads["cls"]``, a linear layer on the non-negative features, D → classes) reads z with its gradient
stopped, so it monitors how linearly the classes sit in z without steering the encoder; the run logs
its cross-entropy (``cls``) and its training accuracy (``cls_acc``). It needs labels. Two ways to run it::

    python examples/ncl_classifier.py    # a tiny synthetic run through the Python API
    bayesncl pretrain --plugin examples/ncl_classifier.py method.name=ncl-cls-example ...

docs/extending.md, "A method with its own head".
"""

from __future__ import annotations

import csv
import tempfile
from pathlib import Path

import torch
from torch import Tensor, nn

import bayesncl
from bayesncl.core.methods import (
    CONTRASTIVE_STATS,
    INFO_NCE,
    Batch,
    Head,
    Key,
    LossTerm,
    Method,
    ModelOutput,
    Statistic,
    term_statistic,
)


class DetachedLinear(nn.Module):
    """A linear classifier on sg(x): x (M, D) → logits (M, classes)."""

    def __init__(self, dim: int, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x.detach())


def _labels(batch: Batch) -> Tensor:
    assert batch.labels is not None  # the method needs labels: a run without them is refused
    return torch.cat([batch.labels, batch.labels])  # both views of the n images


def classifier_ce(out: ModelOutput, batch: Batch, method: object) -> Tensor:
    """Cross-entropy (nats) of the ``cls`` head's logits (2n, classes) against the labels of both views."""
    return nn.functional.cross_entropy(out.heads["cls"].float(), _labels(batch))


def classifier_accuracy(step: bayesncl.core.methods.Step) -> Tensor:
    """The ``cls`` head's accuracy on the batch's 2n views (a fraction, logged in %)."""
    return (step.out.heads["cls"].argmax(1) == step.labels).float().mean()


CLS = LossTerm("cls", classifier_ce, weight="cls_weight", label="CE", inputs=("heads.cls",))

METHOD = bayesncl.register_method(
    Method(
        "ncl-cls-example", nonneg="rep_relu", terms=(INFO_NCE, CLS), needs_labels=True,
        heads={"cls": Head(DetachedLinear)},
        stats=(*CONTRASTIVE_STATS, term_statistic(CLS, "the cls head's cross-entropy (nats)", "CE"),
               Statistic("cls_acc", classifier_accuracy, "the cls head's training accuracy (%)", "acc",
                         percent=True, needs_labels=True)),
        keys={"cls_weight": Key(1.0, "γ, the weight of the cls head's cross-entropy", check=lambda v: v >= 0,
                                expected=">= 0")},
        doc=__doc__,
    )
)

TINY = [
    "data.name=synthetic", "data.train_subset=48", "data.test_subset=20", "data.image_size=16",
    "model.backbone=small_cnn", "model.proj_hidden=32", "model.proj_dim=16", "train.batch_size=16",
    "train.epochs=1", "train.warmup_epochs=0", "train.progress=false", "train.monitor_samples=0",
]


def main() -> list[dict[str, str]]:
    """Train the method for one tiny epoch and print (and return) its log.csv rows."""
    cfg = bayesncl.build_config([*TINY, "method.name=ncl-cls-example"])
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        bayesncl.pretrain(cfg, run_dir=run, evaluate=False)
        rows = list(csv.DictReader((run / "log.csv").open()))
    for r in rows:
        print(f"epoch {r['epoch']}: loss {r['loss']} info_nce {r['info_nce']} cls {r['cls']} "
              f"acc {r['cls_acc']} %")
    return rows


if __name__ == "__main__":
    main()
