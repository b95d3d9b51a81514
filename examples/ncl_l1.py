"""NCL plus an L1 penalty on z, a method from a user's file (docs/extending.md).

The loss is InfoNCE(z̃, τ) + λ₁·mean_i ‖z_i‖₁ (``method.l1_weight`` = λ₁), and the run logs the
penalty's value as its own statistic ``l1`` (log.csv, steps.csv, the curves). Two ways to run it::

    python examples/ncl_l1.py    # a tiny synthetic run through the Python API; prints its statistics
    bayesncl pretrain --plugin examples/ncl_l1.py method.name=ncl-l1-example method.l1_weight=0.001 ...

The name ``ncl-l1-example`` leaves ``ncl-l1`` to a built-in method.
"""

from __future__ import annotations

import csv
import tempfile
from pathlib import Path

from torch import Tensor

import bayesncl
from bayesncl.core.methods import (
    CONTRASTIVE_STATS,
    INFO_NCE,
    Batch,
    Key,
    LossTerm,
    Method,
    ModelOutput,
    term_statistic,
)


def l1_norm(out: ModelOutput, batch: Batch, method: object) -> Tensor:
    """mean over the 2n rows of ‖z_i‖₁ (z: (2n, D) after φ, before the gate), float32."""
    return out.z.float().abs().sum(dim=1).mean()


L1 = LossTerm("l1", l1_norm, weight="l1_weight", label="L1", inputs=("z",))

METHOD = bayesncl.register_method(
    Method(
        "ncl-l1-example", nonneg="rep_relu", terms=(INFO_NCE, L1),
        stats=(*CONTRASTIVE_STATS, term_statistic(L1, "mean ‖z‖₁ (before λ₁)", "L1")),
        keys={"l1_weight": Key(1e-3, "λ₁, the weight of mean ‖z‖₁", check=lambda v: v >= 0, expected=">= 0")},
        doc=__doc__,
    )
)

# synthetic images, a small CNN, 3 steps: the training itself takes seconds; the whole script takes
# 15 s to over a minute on a 2-core CPU, most of it importing torch and torchvision
TINY = [
    "data.name=synthetic", "data.train_subset=48", "data.test_subset=20", "data.image_size=16",
    "model.backbone=small_cnn", "model.proj_hidden=32", "model.proj_dim=16", "train.batch_size=16",
    "train.epochs=1", "train.warmup_epochs=0", "train.progress=false", "train.monitor_samples=0",
]


def main() -> list[dict[str, str]]:
    """Train the method for one tiny epoch and print (and return) its log.csv rows."""
    cfg = bayesncl.build_config([*TINY, "method.name=ncl-l1-example", "method.l1_weight=0.01"])
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        bayesncl.pretrain(cfg, run_dir=run, evaluate=False)
        rows = list(csv.DictReader((run / "log.csv").open()))
    for r in rows:
        print(f"epoch {r['epoch']}: loss {r['loss']} info_nce {r['info_nce']} l1 {r['l1']}")
    return rows


if __name__ == "__main__":
    main()
