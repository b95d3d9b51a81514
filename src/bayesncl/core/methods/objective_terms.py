"""The loss terms, keys, heads and statistics that the NCL paper's other methods share: the spectral
contrastive loss, SupCon, the cross-entropy of a classifier on z (CE, and NCE on φ(p)) and the L1
penalty (:mod:`bayesncl.core.losses` holds their maths; each method's own file combines them).

Every term is a mean over this process's 2n rows (the contrastive ones gather the other processes'
rows, ``batch.gather``); torch is imported when a term first runs, so reading a config does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from bayesncl.core.methods.common import CONTRASTIVE_STATS, LOSS, term_statistic, top1_accuracy
from bayesncl.core.methods.registry import register_method
from bayesncl.core.methods.spec import Batch, Head, Key, LossTerm, Method, Statistic, Step

if TYPE_CHECKING:
    from torch import Tensor

    from bayesncl.core.configs import MethodSettings
    from bayesncl.core.methods.spec import ModelOutput

__all__ = [
    "SPECTRAL", "SUPCON", "CROSS_ENTROPY", "L1", "L1_CLIPPED", "BETA", "MU", "CLASSIFIER", "stats_for",
    "paper_method",
]


def _features(out: ModelOutput) -> Tensor:
    from bayesncl.core.parts import raw_features

    return raw_features(out.z, out.mask)


def _labels(batch: Batch) -> Tensor:
    import torch

    assert batch.labels is not None  # needs_labels: the engine passes them, config refuses data without
    return torch.cat([batch.labels, batch.labels])


def spectral_term(out: ModelOutput, batch: Batch, m: MethodSettings) -> Tensor:
    """The spectral contrastive loss of the raw features (z, or z ⊙ m with a gate), rows clipped to
    norm √μ (``method.mu``): :func:`bayesncl.core.losses.global_spectral_loss`."""
    from bayesncl.core.losses import global_spectral_loss

    return global_spectral_loss(_features(out), m.mu, gather=batch.gather)


def supcon_term(out: ModelOutput, batch: Batch, m: MethodSettings) -> Tensor:
    """SupCon on z̃ at ``method.temperature``, positives the same label anywhere in the global batch:
    :func:`bayesncl.core.losses.global_supcon_loss`."""
    from bayesncl.core.losses import global_supcon_loss

    return global_supcon_loss(out.z_tilde, _labels(batch), m.temperature, gather=batch.gather)


def cross_entropy_term(out: ModelOutput, batch: Batch, m: MethodSettings) -> Tensor:
    """Cross-entropy of the method's classifier (:data:`CLASSIFIER`, a linear layer on the raw
    features z, or z ⊙ m) over the 2n views, from the logits the model computed:
    :func:`bayesncl.core.losses.cross_entropy` (the value of
    :func:`~bayesncl.core.losses.linear_cross_entropy`)."""
    from bayesncl.core.losses import cross_entropy

    return cross_entropy(out.heads["classifier"], _labels(batch))


def l1_term(out: ModelOutput, batch: Batch, m: MethodSettings) -> Tensor:
    """mean‖z̃‖₁ of the unit rows InfoNCE compares (an L1 on z itself would only shrink a scale
    InfoNCE ignores): :func:`bayesncl.core.losses.l1_penalty`."""
    from bayesncl.core.losses import l1_penalty

    return l1_penalty(out.z_tilde)


def l1_clipped_term(out: ModelOutput, batch: Batch, m: MethodSettings) -> Tensor:
    """mean‖z‖₁ of the rows the spectral loss compares (raw features clipped to norm √μ):
    :func:`bayesncl.core.losses.l1_penalty` of :func:`~bayesncl.core.losses.clip_norm`."""
    from bayesncl.core.losses import clip_norm, l1_penalty

    return l1_penalty(clip_norm(_features(out), m.mu))


def _classifier(dim: int, classes: int) -> object:
    from torch import nn

    return nn.Linear(dim, classes)


SPECTRAL = LossTerm("spectral", spectral_term, label="spectral CL", inputs=("z", "mask"))
SUPCON = LossTerm("supcon_loss", supcon_term, label="SupCon", reads=("temperature",), inputs=("z_tilde",))
CROSS_ENTROPY = LossTerm("cross_entropy", cross_entropy_term, label="cross-entropy",
                         inputs=("heads.classifier",))
L1 = LossTerm("l1_penalty", l1_term, weight="beta", label="L1", inputs=("z_tilde",))
L1_CLIPPED = LossTerm("l1_penalty", l1_clipped_term, weight="beta", label="L1", inputs=("z", "mask"))

BETA = {"beta": Key(0.01, "weight β of the L1 term β·mean‖z‖₁ (NCL paper's L1-regularised CL)",
                    lambda v: v >= 0, "beta >= 0 (0: no L1 term)")}
MU = {"mu": Key(1.0, "μ of the spectral loss: rows clipped to norm √μ, the loss divided by μ (HaoChen)",
                lambda v: v > 0, "mu > 0 (1 in HaoChen et al.'s CIFAR config)")}
CLASSIFIER = {"classifier": Head(_classifier)}


def _head_accuracy(s: Step) -> Tensor:
    assert s.labels is not None
    return top1_accuracy(s.out.heads["classifier"], s.labels)


HEAD_ACCURACY = Statistic("train_acc", _head_accuracy, "the method's classifier, training accuracy (%)",
                          "acc", percent=True, needs_labels=True)


def stats_for(*terms: LossTerm, head: bool = False) -> tuple[Statistic, ...]:
    """The statistics of a method whose loss is ``terms`` (in place of InfoNCE): the loss, each
    term's value, the gate's (shown only with a gate), the online probe's accuracy, and with
    ``head`` the accuracy of the method's own classifier on the batch."""
    rest = tuple(s for s in CONTRASTIVE_STATS if s.name not in ("loss", "info_nce"))
    titles = {"spectral": "spectral CL loss", "supcon_loss": "SupCon (nats)", "info_nce": "InfoNCE (nats)",
              "cross_entropy": "cross-entropy (nats)", "l1_penalty": "L1 term mean‖z‖₁ (before β)"}
    own = tuple(term_statistic(t, titles.get(t.name, t.label), t.label) for t in terms)
    return (LOSS, *own, *rest, *((HEAD_ACCURACY,) if head else ()))


def paper_method(
    name: str, doc: str, *terms: LossTerm, nonneg: str, keys: Mapping[str, Key] | None = None,
    labels: bool = False, classifier: bool = False,
) -> Method:
    """Register the NCL paper's method ``name`` (``doc``: its file's docstring): the loss ``terms`` on
    z = φ(p) (φ = ``nonneg``), logging :func:`stats_for` them; ``keys``: its own ``method.*`` keys;
    ``labels``: trained with labels; ``classifier``: a linear classifier on z (:data:`CLASSIFIER`,
    trained with labels, its batch accuracy logged)."""
    stats, heads = stats_for(*terms, head=classifier), CLASSIFIER if classifier else {}
    return register_method(Method(
        name, nonneg=nonneg, terms=terms, stats=stats, keys=dict(keys or {}), heads=heads,
        needs_labels=labels or classifier, doc=doc,
    ))
