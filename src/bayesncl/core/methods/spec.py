"""What a method is, as data (:class:`Method`: a configuration of the model's parts, PAPER-NOTES §1,
never a subclass): its parts, its loss terms, its statistics by name and its own keys; and what
the model hands them (:class:`ModelOutput`). docs/extending.md shows a method from a user's file.
Nothing here imports torch, nor any module that builds the model: the model and the loss import
this module, never the other way round.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from bayesncl.core.configs import MethodSettings, ModelConfig

__all__ = [
    "ModelOutput", "OUTPUTS", "GATE_OUTPUTS", "Batch", "Step", "LossTerm", "Statistic", "Key", "Part", "Head",
    "Method",
]


@dataclass
class ModelOutput:
    """Everything one forward pass produces; shapes for a batch of B images, D = ``model.proj_dim``.

    h: (B, H) backbone features; p: (B, D) raw projector output; z: (B, D) after φ (and TopK);
    logits: (B, D) gate logits / τ_s or None; alpha: (B, D) noise-free σ(logits) or None;
    mask: (B, D) gate mask (hard in forward) or None; z_tilde: (B, D) the features fed to InfoNCE,
    which are also the evaluation features in eval mode (PAPER-NOTES §3); ipw_weights: (D,)
    π^(-1/2) of ``method.ipw`` (the loss then runs on z ⊙ ipw_weights, z̃ stays normalize(z)) or None;
    heads: each of the method's own heads' output by name (:class:`Head`), e.g. CE's logits (B, C).
    Built by :meth:`bayesncl.core.head.ModelHead.project`.
    """

    h: Tensor
    p: Tensor
    z: Tensor
    logits: Tensor | None
    alpha: Tensor | None
    mask: Tensor | None
    z_tilde: Tensor
    ipw_weights: Tensor | None = None
    heads: dict[str, Tensor] = field(default_factory=dict)


OUTPUTS: tuple[str, ...] = tuple(ModelOutput.__dataclass_fields__)
"""The fields of :class:`ModelOutput` a :class:`LossTerm` may read (``LossTerm.inputs``); ``heads.NAME``
names one head's output."""
GATE_OUTPUTS: tuple[str, ...] = ("logits", "alpha", "mask")
"""The outputs only a gate produces (None without one)."""


@dataclass(frozen=True)
class Batch:
    """What a loss term reads of the batch besides the model output, for n images (2n views laid out
    ``[view1; view2]`` in the output). labels: (n,) int class labels, None without labels (a method
    with ``needs_labels`` always gets them); index: (n,) dataset indices or None (views of one index
    are all positives); gather: take contrastive negatives from every process (torch.distributed)."""

    labels: Tensor | None = None
    index: Tensor | None = None
    gather: bool = False


@dataclass(frozen=True)
class LossTerm:
    """One term of a method's loss: ``weight_value · fn(out, batch, method_cfg)``.

    fn: a pure function of the :class:`ModelOutput`, the :class:`Batch` and the checked ``method.*``
    config, returning a 0-d float32 tensor, a mean over this process's rows; the built-in terms call
    a function of :mod:`bayesncl.core.losses` on the outputs they read. name: its statistic name
    (``step.terms[name]``); weight: the ``method.*`` key that weighs it (None: 1, added unscaled);
    label: its name in messages (``InfoNCE``); reads: the other ``method.*`` keys it reads (a key
    nothing reads gets a "has no effect" warning); inputs: a tuple of the :class:`ModelOutput` fields
    ``fn`` reads (:data:`OUTPUTS`, ``heads.NAME`` for one head's output; ``()``: not declared), checked
    when the method registers (a bare string, a name that is no output, a head the method lacks, a
    gate's output in a method that cannot have a gate: one ConfigError line)."""

    name: str
    fn: Callable[[ModelOutput, Batch, MethodSettings], Tensor]
    weight: str | None = None
    label: str = ""
    reads: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Step:
    """What a statistic reads of one training step (all on the device, nothing synchronised).

    loss: the method's loss (0-d); terms: each loss term's detached value by name (terms of absent
    parts are missing); out: the model output (None in fine-tuning, which has no projector: its
    statistics read ``loss``, ``class_logits`` and ``labels`` only); class_logits: (2n, classes) the
    online probe's logits on sg(h) (fine-tuning: the head's, (n, classes)) or None; labels: the labels
    of those rows or None; method: the checked
    ``method.*`` config (the gate's threshold, say; :func:`bayesncl.core.methods.statistics` fills it
    in where it is None)."""

    loss: Tensor
    terms: dict[str, Tensor]
    out: ModelOutput | None
    class_logits: Tensor | None = None
    labels: Tensor | None = None
    method: MethodSettings | None = None


@dataclass(frozen=True)
class Statistic:
    """A training statistic logged under ``name``: ``fn(step)`` is a 0-d tensor per step (no host
    sync); the loop logs its mean over the epoch's steps and processes (log.csv, steps.csv,
    TensorBoard, W&B) and the curves draw it.

    title: its training-curves panel ("" none); short: its name on the progress bar and the epoch
    line ("" not shown); percent: logged × 100; needs_labels: not logged where the data has no labels
    (no column, :meth:`Method.logged`);
    gated: means something only with a gate (a run without one does not log it: no column,
    :meth:`Method.logged`);
    reference: a ``method.*`` key logged beside it and drawn dashed on its panel; per_step: also a
    steps.csv column; alarm: (threshold, message) printed when the epoch's mean exceeds it (``{pct}``
    in the message: the mean in %); ylim: the panel's y range."""

    name: str
    fn: Callable[[Step], Tensor]
    title: str = ""
    short: str = ""
    percent: bool = False
    needs_labels: bool = False
    gated: bool = False
    reference: str = ""
    per_step: bool = True
    alarm: tuple[float, str] | None = None
    ylim: tuple[float, float] | None = None


@dataclass(frozen=True)
class Key:
    """A ``method.*`` key, declared where it belongs: by the method config (``name``, ``nonneg``,
    ``temperature``), by a part (:attr:`Part.keys`: ``method.rho``, ``method.gate_depth``, ...) or by
    a method of its own (:attr:`Method.keys`). Its default (its type is the default's: bool, int,
    float or str), what it is (``help``), and a check of a value (``check(value)`` True when valid;
    the error says ``method.NAME=value: expected {expected}``). A key with a fixed set of values
    (``method.gate``) is checked against ``bayesncl.config.choices()`` instead."""

    default: Any
    help: str = ""
    check: Callable[[Any], bool] | None = None
    expected: str = ""


@dataclass(frozen=True)
class Part:
    """An optional part of the model (the gate, TopK, ...), in one place: whether a method config
    has it (``present``), the ``method.*`` keys it declares (``keys``: a :class:`Key` each, in the
    order the config lists them; they are common ``method.*`` fields of every run, read as
    ``cfg.method.NAME``), the one of them that turns it on (``switch``: read whether or not the part is
    there), the keys of other parts it reads too (``reads``: TopK reads the prior's ``rho``), the loss
    terms it brings to any method that has it, and a check of a config that has it
    (``check(method, model)`` raising ConfigError; the keys' own checks run for every config).
    :meth:`settings` are the keys that have no effect without it (the "has no effect" warning)."""

    present: Callable[[MethodSettings], bool]
    keys: Mapping[str, Key] = field(default_factory=dict)
    terms: tuple[LossTerm, ...] = ()
    switch: str = ""
    reads: tuple[str, ...] = ()
    check: Callable[[MethodSettings, ModelConfig], None] | None = None

    def settings(self) -> tuple[str, ...]:
        """The keys (without ``method.``) only a config with this part reads: its keys but the
        switch, then :attr:`reads`."""
        return (*(k for k in self.keys if k != self.switch), *self.reads)


@dataclass(frozen=True)
class Head:
    """A trainable module a method adds after φ, e.g. CE's classifier: ``build(D, classes)`` makes
    it (D = ``model.proj_dim``, classes = the dataset's), the model head
    (:class:`bayesncl.core.head.ModelHead`) runs it on the loss's raw features (z, or z ⊙ m with a
    gate: :func:`bayesncl.core.parts.raw_features`) in every forward and its output is
    ``out.heads[name]``. Its parameters are ``heads.NAME.*``, trained with the encoder's learning
    rate, saved and resumed with the model."""

    build: Callable[[int, int], Any]


@dataclass(frozen=True)
class Method:
    """A method: the parts ``method.name=NAME`` presets (the ``method.*`` fields of the same names;
    an ablation may override any), its loss terms, the statistics it logs, its own keys.

    nonneg: φ, a key of :data:`bayesncl.core.parts.NONNEG`; topk: keep the round(ρ·D) largest
    entries of z; gate: a kind of :data:`bayesncl.core.parts.GATE_KINDS` ("none": no gating head);
    gate_depth, detach: the gating head's depth and whether it reads sg(h); ipw: InfoNCE on the
    inverse-prevalence similarity (Definition 4.4). terms: its loss terms (the gate adds λ·KL);
    stats: what it logs, :data:`~bayesncl.core.methods.common.CONTRASTIVE_STATS` plus its own;
    keys: its own ``method.*`` keys; needs_labels: a supervised method (refused with
    ``data.labels=none``); heads: trainable modules it adds after φ (:class:`Head`); gateable: its
    loss reads the gated features (False: a ``method.gate`` other than none is refused in one line);
    check: more checks of a config, ``check(method, model)`` raising ConfigError;
    source: the file that registered it (None: built in)."""

    name: str
    nonneg: str = "rep_relu"
    topk: bool = False
    gate: str = "none"
    gate_depth: int = 2
    detach: bool = True
    ipw: bool = False
    terms: tuple[LossTerm, ...] = ()
    stats: tuple[Statistic, ...] = ()
    keys: Mapping[str, Key] = field(default_factory=dict)
    needs_labels: bool = False
    heads: Mapping[str, Head] = field(default_factory=dict)
    gateable: bool = True
    check: Callable[[MethodSettings, ModelConfig], None] | None = None
    doc: str = ""
    source: str | None = None

    @property
    def gated(self) -> bool:
        return self.gate != "none"

    def logged(self, m: MethodSettings, labeled: bool = True) -> tuple[Statistic, ...]:
        """The statistics a run of ``m`` (this method's ``method.*`` config) logs, in log.csv's order:
        :attr:`stats`, less the gate's (``Statistic.gated``) where ``m`` has no gate
        (``method.gate=none``) and, where its data has no labels (``labeled`` False:
        ``data.labels=none``, an image folder without classes), less those that need them
        (``Statistic.needs_labels``: the online probe's ``online_acc``). Its log.csv and steps.csv
        have a column for these only, and its step computes these only."""
        gated = m.gate != "none"
        return tuple(s for s in self.stats if (gated or not s.gated) and (labeled or not s.needs_labels))

    @property
    def parts(self) -> dict[str, Any]:
        """The ``method.*`` fields it presets, e.g. ``{"nonneg": "rep_relu", "topk": False, ...}``."""
        return {"nonneg": self.nonneg, "topk": self.topk, "gate": self.gate, "gate_depth": self.gate_depth,
                "detach": self.detach, "ipw": self.ipw}
