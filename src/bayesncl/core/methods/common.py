"""The loss terms, statistics and parts the built-in methods share (PAPER-NOTES §1).

:data:`INFO_NCE` is every InfoNCE method's term; the gate's prior (:data:`PARTS` ``"prior"``, there
with the gate) brings :data:`KL` to any method it is part of. Each part declares its ``method.*``
keys (:class:`~bayesncl.core.methods.spec.Key`). Each term reads the model outputs it declares
(``LossTerm.inputs``) and calls a function of :mod:`bayesncl.core.losses`, which holds the maths.
:data:`CONTRASTIVE_STATS` is what every built-in method logs (the gate's statistics only by a run
with a gate). torch is imported when a term first runs, so reading a config does not import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from bayesncl.core.configs import ConfigError
from bayesncl.core.methods.spec import Batch, Key, LossTerm, Part, Statistic, Step

if TYPE_CHECKING:
    import numpy as np
    from torch import Tensor

    from bayesncl.core.configs import MethodSettings, ModelConfig
    from bayesncl.core.methods.spec import ModelOutput

__all__ = [
    "INFO_NCE", "KL", "PARTS", "CONTRASTIVE_STATS", "FINETUNE_STATS", "LOSS", "term_statistic", "closed_rows",
    "class_accuracy", "top1_accuracy",
]

ArrayT = TypeVar("ArrayT", "Tensor", "np.ndarray")


def info_nce_term(out: ModelOutput, batch: Batch, m: MethodSettings) -> Tensor:
    """InfoNCE(z̃ over the 2n views, ``method.temperature``), or of
    :func:`~bayesncl.core.parts.ipw_features` ``(z, ipw_weights)`` with ``method.ipw``
    (Definition 4.4); the negatives from every process with ``batch.gather``, every view of the same
    ``batch.index`` a positive: :func:`bayesncl.core.losses.global_info_nce`, a mean over the 2n
    local rows."""
    import torch

    from bayesncl.core import losses, parts

    z = out.z_tilde if out.ipw_weights is None else parts.ipw_features(out.z, out.ipw_weights)
    idx = None if batch.index is None else torch.cat([batch.index, batch.index])
    return losses.global_info_nce(z, m.temperature, index=idx, gather=batch.gather)


def kl_term(out: ModelOutput, batch: Batch, m: MethodSettings) -> Tensor:
    """KL(Bern(α) ‖ Bern(ρ)) summed over dims, mean over rows (:func:`bayesncl.core.losses.bernoulli_kl`)."""
    from bayesncl.core.losses import bernoulli_kl

    assert out.alpha is not None  # the gate brings this term
    return bernoulli_kl(out.alpha, m.rho)


INFO_NCE = LossTerm("info_nce", info_nce_term, label="InfoNCE", reads=("temperature",),
                    inputs=("z_tilde", "z", "ipw_weights"))
KL = LossTerm("kl", kl_term, weight="lam", label="KL", reads=("rho",), inputs=("alpha",))

def _gate_check(m: MethodSettings, mo: ModelConfig) -> None:
    hidden = m.gate_hidden or mo.proj_hidden
    if m.gate_depth >= 3 and hidden < 2:
        raise ConfigError(
            f"method.gate_depth=3: the gate's hidden width is {hidden} (method.gate_hidden, or "
            "model.proj_hidden when 0): expected >= 2 (its second layer is hidden // 2 wide)"
        )


def _topk_check(m: MethodSettings, mo: ModelConfig) -> None:
    k = round(m.rho * mo.proj_dim)
    if not 1 <= k <= mo.proj_dim:
        raise ConfigError(f"TopK k=round(rho*D)={k} with rho={m.rho}, D={mo.proj_dim}: expected 1 <= k <= D")


def _ipw_check(m: MethodSettings, mo: ModelConfig) -> None:
    if m.gate != "none":
        raise ConfigError(
            f"method.ipw=true (method.name={m.name}) with method.gate={m.gate}: the inverse-prevalence "
            "similarity replaces the gate it approximates; use method.gate=none (or method.name=bayesncl "
            "for the gate)"
        )


PARTS: dict[str, Part] = {
    "topk": Part(
        lambda m: m.topk,
        {"topk": Key(False, "keep the round(rho*D) largest entries of z")},
        switch="topk", reads=("rho",), check=_topk_check,
    ),
    "gate": Part(
        lambda m: m.gate != "none",
        {
            "gate": Key("ste", 'a kind of bayesncl.core.parts.GATE_KINDS ("none": no gate)'),
            "gate_depth": Key(2, "1, 2 or 3 linear layers", lambda v: v in (1, 2, 3), "1, 2 or 3"),
            "gate_hidden": Key(0, "0: same as model.proj_hidden", lambda v: v >= 0, ">= 0"),
            "detach": Key(True, 'gate input is sg(h); false is the "no detach" ablation'),
            "gate_lr": Key(
                0.0, "> 0: the gate's peak lr, not scaled with the batch (authors' code, recipes: 0.1)",
                lambda v: v >= 0, ">= 0 (0: gate_lr_ratio x the backbone lr)",
            ),
            "gate_lr_ratio": Key(0.25, "used when gate_lr=0: gate lr = ratio * backbone lr (paper Table 15)",
                                 lambda v: v >= 0, ">= 0"),
            "threshold": Key(0.5, "hard mask 1[alpha > threshold]", lambda v: 0.0 < v < 1.0,
                             "0 < threshold < 1"),
            "gate_tau": Key(1.0, "sigmoid temperature tau_s", lambda v: v > 0.0, "> 0"),
        },
        switch="gate", check=_gate_check,
    ),
    "gumbel": Part(
        lambda m: m.gate == "gumbel",
        {"gumbel_noise": Key("gumbel", "a name of bayesncl.core.parts.NOISES (gumbel: the authors' code)")},
    ),
    "prior": Part(
        lambda m: m.gate != "none",
        {
            "rho": Key(0.8, "Bernoulli prior; also the TopK keep fraction", lambda v: 0.0 < v < 1.0,
                       "0 < rho < 1"),
            "lam": Key(3e-5, "KL weight lambda", lambda v: v >= 0.0, "lambda >= 0"),
        },
        (KL,),
    ),
    "ipw": Part(
        lambda m: m.ipw,
        {
            "ipw": Key(False, "InfoNCE on the inverse-prevalence similarity (Definition 4.4, ncl-ipw)"),
            "ipw_momentum": Key(
                0.99, "EMA momentum of the prevalence pi_k (batch activation frequency of z_k)",
                lambda v: 0.0 <= v < 1.0, "0 <= momentum < 1",
            ),
            "ipw_eps": Key(0.01, "floor of pi_k in the weights pi_k^(-1/2)", lambda v: 0.0 < v <= 1.0,
                           "0 < eps <= 1"),
        },
        switch="ipw", check=_ipw_check,
    ),
}
"""The optional parts, each with the ``method.*`` keys it declares (:class:`~.spec.Part`; in this
order they are fields of :class:`~bayesncl.core.methods.MethodConfig`, after the method config's own
:data:`~bayesncl.core.methods.keys.COMMON_KEYS`): TopK (k = round(ρ·D)), the gating head with its
gate, the Gumbel gate's noise, the gate's Bernoulli prior Bern(ρ) with its λ·KL term, the prevalence
EMA of the inverse-prevalence similarity. A new part is one more entry here."""


def term_statistic(term: LossTerm, title: str = "", short: str = "", gated: bool = False) -> Statistic:
    """The statistic of a loss term's value (its name); ``gated``: the term of the gate (logged only
    with one)."""
    return Statistic(term.name, lambda s: s.terms[term.name], title=title, short=short, gated=gated)


def open_gates(s: Step) -> Tensor:
    """The open gates of a step, (2n, D) bool: ``1[α > method.threshold]`` on the noise-free α, the
    hard mask evaluation gates by (PAPER-NOTES §3) whatever the gate (``ste``: the training mask itself;
    ``gumbel``: not the noisy training sample's; ``soft``: not α, the training mask)."""
    assert s.out.alpha is not None and s.method is not None  # a gate's statistic: logged only with a gate
    return s.out.alpha > s.method.threshold


def open_rate(s: Step) -> Tensor:
    """``gate_open``: the fraction of open gates, mean of 1[α > method.threshold] over the 2n rows
    and D dims (0-d float32). Logs written before it held the soft gate's mean α here."""
    return open_gates(s).float().mean()


def mean_alpha(s: Step) -> Tensor:
    """``gate_mean_alpha``: the mean gate probability α = σ(logits) over the 2n rows and D dims
    (0-d float32), what KL(Bern(α) ‖ Bern(ρ)) pulls towards ρ."""
    assert s.out.alpha is not None
    return s.out.alpha.float().mean()


def closed_rows(open_: ArrayT) -> ArrayT:
    """The rows with every gate closed: (M,) bool from the open gates ``open_`` (M, D) bool, a torch
    tensor or a NumPy array (``1[α > method.threshold]``, :func:`open_gates`). Their share is
    ``rows_all_closed``: logged in training (the 2n views of a step) and in evaluation.json (the
    test images, ``app.evaluate``)."""
    return ~open_.any(1)


def _closed_rows(s: Step) -> Tensor:
    return closed_rows(open_gates(s)).float().mean()


def top1_accuracy(logits: Tensor, labels: Tensor) -> Tensor:
    """The share of rows whose largest logit is their label: ``logits`` (M, C), ``labels`` (M,) ->
    0-d float32 in [0, 1] (the first largest where logits tie, ``argmax``'s)."""
    return (logits.argmax(1) == labels).float().mean()


def class_accuracy(s: Step) -> Tensor:
    """:func:`top1_accuracy` of a step's ``class_logits`` against its ``labels``: the online probe's
    on sg(h) in pretraining (``online_acc``), the classifier's on the train batches in fine-tuning
    (:data:`FINETUNE_STATS`)."""
    assert s.class_logits is not None and s.labels is not None  # logged only where the step has both
    return top1_accuracy(s.class_logits, s.labels)


LOSS = Statistic("loss", lambda s: s.loss.detach(), short="loss")
CONTRASTIVE_STATS: tuple[Statistic, ...] = (
    LOSS,
    term_statistic(INFO_NCE, "InfoNCE (nats)", "InfoNCE"),
    term_statistic(KL, "KL(Bern(α) ‖ Bern(ρ)), sum over dims", "KL", gated=True),
    Statistic("gate_open", open_rate, "gate open rate (α > threshold) vs ρ (dashed)", "open",
              gated=True, reference="rho", ylim=(0, 1.02)),
    Statistic("gate_mean_alpha", mean_alpha, "mean gate probability α vs ρ (dashed)", "α", gated=True,
              reference="rho", ylim=(0, 1.02)),
    Statistic("rows_all_closed", _closed_rows, gated=True, per_step=False,
              alarm=(0.5, "gate collapse: {pct:.0f}% of rows have every gate closed")),
    Statistic("online_acc", class_accuracy, "online probe accuracy (%)", percent=True, needs_labels=True),
)
"""The statistics of every built-in method, in log.csv's order: the loss, InfoNCE, KL, the
gate-open rate (the share of α > ``method.threshold``, with ρ), the mean gate probability α, the
fraction of rows with every gate closed (every α <= threshold), the online probe's accuracy on sg(h)
(a fraction, logged in %). A method's ``stats`` must start with :data:`LOSS`."""
FINETUNE_STATS: tuple[Statistic, ...] = (
    LOSS,  # the cross-entropy
    Statistic("online_acc", class_accuracy, "train accuracy of backbone + head (%)", "train acc",
              percent=True),
)
"""Fine-tuning's statistics (``bayesncl finetune``, :mod:`bayesncl.app.finetune`; log.csv's and
steps.csv's columns, the epoch line's ``loss`` and ``train acc``): the cross-entropy and the head's
accuracy on the augmented train batches (a fraction, logged in %), under the names pretraining gives
its loss and its online probe's accuracy; their titles name a fine-tuning log's panels
(``app.report.curves``), not the online probe's."""
