"""The method registry: each method is a spec of parts (PAPER-NOTES §1), never a subclass.

:data:`METHODS` maps a name (``method.name``) to a :class:`MethodSpec`. ``config`` derives its
presets from it (:func:`preset`) and names the method a configuration of parts is
(:func:`closest`); the model builds the parts the resolved config names. Adding a method is one
entry here (with its parts in :mod:`bayesncl.core.parts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MethodSpec", "METHODS", "PART_KEYS", "preset", "closest", "unread_keys"]


@dataclass(frozen=True)
class MethodSpec:
    """The parts that define a method; the config fields of the same names (``method.*``) take
    these values from the preset, and an ablation may override any of them.

    nonneg: φ, a key of :data:`bayesncl.core.parts.NONNEG`. topk: keep the k = round(ρ·D) largest
    entries of z (else none). gate: a kind of :data:`bayesncl.core.parts.GATE_KINDS` ("none": no
    gating head). gate_depth, detach: the gating head's depth and whether it reads sg(h).
    ipw: InfoNCE on the inverse-prevalence similarity of Definition 4.4 (features scaled by
    π_k^(-1/2), π an EMA of the activation frequency: :class:`bayesncl.core.parts.Prevalence`).
    loss: the loss terms, ``info_nce`` and (gated methods) ``kl`` = λ·KL(Bern(α) ‖ Bern(ρ)).
    stats: the training statistics that mean something for the method (``bayesncl.core.engine``
    logs them all; the gate's are constant without a gate).
    """

    nonneg: str
    topk: bool = False
    gate: str = "none"
    gate_depth: int = 2
    detach: bool = True
    ipw: bool = False
    loss: tuple[str, ...] = ("info_nce",)
    stats: tuple[str, ...] = ("loss", "info_nce", "online_acc")

    @property
    def gated(self) -> bool:
        return self.gate != "none"


_GATED = {
    "loss": ("info_nce", "kl"),
    "stats": ("loss", "info_nce", "kl", "gate_open", "rows_all_closed", "online_acc"),
}

METHODS: dict[str, MethodSpec] = {
    "cl": MethodSpec(nonneg="identity"),  # SimCLR
    "ncl": MethodSpec(nonneg="rep_relu"),  # non-negative CL (NCL paper)
    "ncl-topk": MethodSpec(nonneg="rep_relu", topk=True),  # NCL with the TopK baseline
    "bayesncl": MethodSpec(nonneg="rep_relu", gate="ste", **_GATED),  # the paper's method
    "bayesncl-gs": MethodSpec(nonneg="rep_relu", gate="gumbel", **_GATED),  # Gumbel-sigmoid gate
    "ncl-ipw": MethodSpec(nonneg="rep_relu", ipw=True),  # NCL on Definition 4.4's explicit similarity
}
"""The methods by name, in the order tables list them."""


def preset(name: str) -> dict[str, Any]:
    """The ``method.*`` values (without the prefix) that ``method.name=name`` sets: the spec's
    parts, and ``lam`` = 0 for a method without the KL term. ``name``: a key of :data:`METHODS`."""
    s = METHODS[name]
    out: dict[str, Any] = {
        "nonneg": s.nonneg, "topk": s.topk, "gate": s.gate, "gate_depth": s.gate_depth, "detach": s.detach,
        "ipw": s.ipw,
    }
    if "kl" not in s.loss:
        out["lam"] = 0.0
    return out


def closest(name: str, nonneg: str, topk: bool, gate: str, ipw: bool = False) -> str:
    """The method a configuration of parts is: the registered spec that agrees on, in this order,
    having a gate, TopK, the inverse-prevalence similarity, and a non-negativity map (φ ≠
    identity); ties go to ``name`` (the
    configured method), then to the spec with the same gate kind, then to the first registered.

    So the ablations of a method (a soft gate, another φ, another head depth, no detach) stay that
    method, while switching its defining part off (or another method's on) makes it another, e.g.
    ``closest("ncl", "rep_relu", False, "ste") == "bayesncl"``.
    """

    def distance(item: tuple[str, MethodSpec]) -> tuple[bool, ...]:
        key, s = item
        return (
            s.gated != (gate != "none"), s.topk != topk, s.ipw != ipw,
            (s.nonneg == "identity") != (nonneg == "identity"), key != name, s.gate != gate,
        )

    return min(METHODS.items(), key=distance)[0]


PART_KEYS: dict[str, tuple[str, ...]] = {
    "gate": (
        "lam", "gate_depth", "gate_hidden", "detach", "gate_lr", "gate_lr_ratio", "threshold", "gate_tau",
        "rho",
    ),
    "topk": ("rho",),
    "gumbel": ("gumbel_noise",),
    "ipw": ("ipw_momentum", "ipw_eps"),
}
"""The ``method.*`` keys (without the prefix) that only one optional part reads: the gating head
with its gate and KL term, TopK (k = round(ρ·D)), the Gumbel gate's noise, the prevalence EMA."""


def unread_keys(topk: bool, gate: str, ipw: bool = False) -> set[str]:
    """The keys of :data:`PART_KEYS` that no part of a method with ``topk`` and ``gate`` reads,
    e.g. ``{"gumbel_noise"}`` for the STE gate; every other ``method.*`` key is always read."""
    present = {"gate": gate != "none", "topk": topk, "gumbel": gate == "gumbel", "ipw": ipw}
    every = {k for keys in PART_KEYS.values() for k in keys}
    return every - {k for part, keys in PART_KEYS.items() if present[part] for k in keys}
