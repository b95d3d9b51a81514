"""Import checkpoints of the authors' code (BayesNCL and NCL, both built on solo-learn).

Their Lightning checkpoint's ``state_dict`` holds ``backbone.*`` (torchvision ResNet names without
fc; CIFAR: a 3×3 conv1, stride 1, padding 2, no max-pool), ``projector.0.*`` Linear(H, hidden) and
``projector.2.*`` Linear(hidden, D), ``gating_head.{0,2,4}.*`` (BayesNCL only; depth 1 to 3, the
third layer hidden → hidden // 2) and ``classifier.*`` Linear(H, num_classes). Our
:class:`bayesncl.core.model.ContrastiveModel` has the same parts, the projector and gating head one
level deeper (``projector.net.0.weight``). :func:`load_official_checkpoint` infers the architecture
from the shapes, builds our model and loads every tensor strictly (a key left over or missing, or
another shape, is an error listing expected and found shapes).

Overrides (``key=value``) give what the weights cannot say: the method (a gating head means
``bayesncl``, none ``ncl``; ``method.name=cl`` for SimCLR, ``ncl-topk`` for TopK) and the data
(``data.name=cifar100 data.root=DIR``). The file is read with ``weights_only=True``
(:func:`bayesncl.runs.safe_load.load_checkpoint_file`); a Lightning checkpoint holding Python
objects is refused: if you trust it, pass ``torch.save(torch.load(path,
weights_only=False)["state_dict"], "weights.pt")``'s file instead (a bare state dict is accepted).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bayesncl.config import Config, build_config, parse_overrides
from bayesncl.core.model import ContrastiveModel, build_model
from bayesncl.runs.messages import some_names
from bayesncl.runs.safe_load import CheckpointError, load_checkpoint_file

OFFICIAL_PARTS = ("backbone", "projector", "gating_head", "classifier")
RESNET_BLOCKS = {"resnet18": ((2, 2, 2, 2), False), "resnet50": ((3, 4, 6, 3), True)}  # blocks, bottleneck
_SHOW = 4  # keys listed per category in an error


def _shape(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(d) for d in t.shape) + ("," if t.ndim == 1 else "") + ")"


def _listing(sd: dict[str, torch.Tensor], keys: list[str]) -> str:
    return some_names([f"{k} {_shape(sd[k])}" for k in keys], _SHOW)


def official_state_dict(obj: Any, where: str = "checkpoint") -> dict[str, torch.Tensor]:
    """The ``{name: tensor}`` weights of a Lightning checkpoint (its ``state_dict``) or of a bare
    state dict; a ``module.`` prefix on every key (DDP) is removed. Raises CheckpointError."""
    sd = obj.get("state_dict", obj) if isinstance(obj, dict) else None
    if not isinstance(sd, dict) or not sd:
        raise CheckpointError(f"{where} holds no state dict (a dict of tensors, or a dict with 'state_dict')")
    bad = [str(k) for k, v in sd.items() if not (isinstance(k, str) and isinstance(v, torch.Tensor))]
    if bad:
        shown = ", ".join(bad[:_SHOW])
        raise CheckpointError(f"{where}: state dict entries that are not named tensors: {shown}")
    if all(k.startswith("module.") for k in sd):
        sd = {k[len("module.") :]: v for k, v in sd.items()}
    return sd


def looks_official(obj: Any) -> bool:
    """Whether ``obj`` (a loaded file) holds authors'-layout weights: ``backbone.*`` keys."""
    try:
        sd = official_state_dict(obj)
    except CheckpointError:
        return False
    return any(k.startswith("backbone.") for k in sd)


def _indices(sd: dict[str, torch.Tensor], part: str) -> dict[int, list[str]]:
    """``{layer index: [keys]}`` for keys ``part.<int>.*``; other keys under ``part.`` go to -1."""
    out: dict[int, list[str]] = {}
    for k in sd:
        if k.startswith(part + "."):
            m = re.match(rf"{part}\.(\d+)\.", k)
            out.setdefault(int(m.group(1)) if m else -1, []).append(k)
    return out


def _infer_backbone(sd: dict[str, torch.Tensor], where: str) -> dict[str, Any]:
    conv1 = sd.get("backbone.conv1.weight")
    if conv1 is None or conv1.ndim != 4:
        some = [k for k in sd if k.startswith("backbone.")]
        raise CheckpointError(
            f"{where}: the backbone is not a ResNet (no backbone.conv1.weight of shape (64, C, k, k); "
            f"found {_listing(sd, some)}): only ResNet-18 and ResNet-50 backbones can be imported"
        )
    blocks = tuple(
        len({m.group(1) for k in sd if (m := re.match(rf"backbone\.layer{i}\.(\d+)\.", k))})
        for i in range(1, 5)
    )
    bottleneck = "backbone.layer1.0.conv3.weight" in sd
    arch = next((a for a, (b, bn) in RESNET_BLOCKS.items() if b == blocks and bn == bottleneck), None)
    if arch is None:
        kind = "bottleneck" if bottleneck else "basic"
        raise CheckpointError(
            f"{where}: unsupported ResNet: found {kind} blocks per stage {blocks}; expected resnet18 "
            f"(basic blocks (2, 2, 2, 2)) or resnet50 (bottleneck blocks (3, 4, 6, 3))"
        )
    k = tuple(conv1.shape[2:])
    if k not in ((3, 3), (7, 7)):
        raise CheckpointError(
            f"{where}: backbone.conv1.weight {_shape(conv1)}: expected a 3x3 (CIFAR stem) or 7x7 kernel"
        )
    return {"arch": arch, "cifar_stem": k == (3, 3), "in_channels": int(conv1.shape[1])}


def _linear_stack(
    sd: dict[str, torch.Tensor], part: str, allowed: dict[tuple[int, ...], str], expected: str, where: str
) -> tuple[tuple[int, ...], list[torch.Tensor]]:
    """Check that ``part`` is Linear layers at one of the ``allowed`` index sets (ReLUs between them
    hold no weights). Returns (indices, weights). Raises CheckpointError naming expected and found."""
    groups = _indices(sd, part)
    idx = tuple(sorted(groups))
    keys_ok = all(
        sorted(groups[i]) == [f"{part}.{i}.bias", f"{part}.{i}.weight"] and sd[f"{part}.{i}.weight"].ndim == 2
        for i in idx
        if i >= 0
    )
    if idx not in allowed or not keys_ok:
        found = [k for i in idx for k in sorted(groups[i])]
        raise CheckpointError(
            f"{where}: {part} does not have the layout bayesncl can import: expected {expected}; "
            f"found {_listing(sd, found)}"
        )
    return idx, [sd[f"{part}.{i}.weight"] for i in idx]


def infer_official_config(
    sd: dict[str, torch.Tensor], overrides: list[str] | dict[str, Any] | None = None,
    where: str = "checkpoint",
) -> tuple[Config, dict[str, Any]]:
    """The Config that the weights ``sd`` (authors' layout) describe, with ``overrides`` on top.

    Returns ``(config, facts)``; ``facts`` holds what the config cannot express: ``in_channels``,
    ``num_classes`` (None without a classifier) and ``h_dim``. Raises CheckpointError for weights
    of another layout, ConfigError for bad overrides.
    """
    unknown = sorted({k.split(".")[0] for k in sd} - set(OFFICIAL_PARTS))
    if unknown:
        raise CheckpointError(
            f"{where}: unexpected parts {', '.join(unknown)} (e.g. "
            f"{next(k for k in sd if k.split('.')[0] == unknown[0])}); a BayesNCL/NCL/SimCLR checkpoint "
            f"holds only {', '.join(OFFICIAL_PARTS)}"
        )
    bb = _infer_backbone(sd, where)
    _, (p0, p2) = _linear_stack(
        sd, "projector", {(0, 2): ""}, "Linear-ReLU-Linear: projector.0.weight (hidden, H), "
        "projector.0.bias (hidden,), projector.2.weight (D, hidden), projector.2.bias (D,)", where
    )
    stem = "true" if bb["cifar_stem"] else "false"
    flat: dict[str, Any] = {"model.backbone": bb["arch"], "model.cifar_stem": stem,
                            "model.proj_hidden": int(p0.shape[0]), "model.proj_dim": int(p2.shape[0])}
    if any(k.startswith("gating_head.") for k in sd):
        idx, ws = _linear_stack(
            sd, "gating_head", {(0,): "", (0, 2): "", (0, 2, 4): ""},
            "1 to 3 Linear layers at gating_head.0, .2, .4 (ReLU between them)", where,
        )
        flat["method.name"] = "bayesncl"
        flat["method.gate_depth"] = len(idx)
        flat["method.gate_hidden"] = int(ws[0].shape[0]) if len(idx) > 1 else 0
    else:
        flat["method.name"] = "ncl"
    user = parse_overrides(overrides) if isinstance(overrides, list) else dict(overrides or {})
    flat.update(user)
    cfg = build_config(overrides=flat)
    cls = sd.get("classifier.weight")
    n_cls = int(cls.shape[0]) if cls is not None and cls.ndim == 2 else None
    return cfg, {"in_channels": bb["in_channels"], "num_classes": n_cls, "h_dim": int(p0.shape[1])}


def load_state_strict(model: nn.Module, sd: dict[str, torch.Tensor], where: str, what: str) -> None:
    """``model.load_state_dict(sd)`` after checking names and shapes ourselves, so that a mismatch
    is one line listing the missing, unexpected and mis-shaped tensors (expected vs found)."""
    own = model.state_dict()
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    wrong = [k for k in own if k in sd and own[k].shape != sd[k].shape]
    if missing or unexpected or wrong:
        parts = []
        if wrong:
            shapes = [f"{k} expected {_shape(own[k])} found {_shape(sd[k])}" for k in wrong]
            parts.append(f"shape mismatch: {some_names(shapes, _SHOW)}")
        if missing:
            parts.append(f"missing: {_listing(own, missing)}")
        if unexpected:
            parts.append(f"unexpected: {_listing(sd, unexpected)}")
        raise CheckpointError(f"{where} does not fit {what}: " + "; ".join(parts))
    model.load_state_dict(sd, strict=True)


def describe(cfg: Config) -> str:
    """A short architecture summary for messages, e.g. ``bayesncl: resnet18 (CIFAR stem), projector
    hidden 2048 -> 256, gate depth 2``."""
    m, me = cfg.model, cfg.method
    stem = " (CIFAR stem)" if m.cifar_stem == "true" else ""
    text = f"{me.name}: {m.backbone}{stem}, projector hidden {m.proj_hidden} -> {m.proj_dim}"
    return text + (f", gate depth {me.gate_depth}" if me.gate != "none" else "")


def load_official_checkpoint(
    path: str | Path, overrides: list[str] | dict[str, Any] | None = None, *, num_classes: int | None = None,
    obj: Any = None,
) -> tuple[ContrastiveModel, Config]:
    """Load an authors'-layout checkpoint (BayesNCL / NCL / SimCLR from solo-learn) as our model.

    path: a Lightning ``.ckpt``, a ``torch.save``'d state dict or a ``.safetensors`` file, read
    safely (``obj``: the file already loaded). overrides: ``key=value`` strings or a dict on top of
    the inferred config. num_classes: the classifier size when the file has no ``classifier.*``
    (then freshly initialised; extract/evaluate do not use it). A CIFAR-stem conv1 gets
    ``model.stem_padding`` (default 2, solo-learn's).

    returns: ``(model in eval mode on CPU, config)``. Raises CheckpointError (one line) for an
    unsafe or unreadable file, another layout or a shape that differs from the inferred
    architecture (expected and found); ConfigError for bad overrides.
    """
    where = str(path)
    if obj is None:
        obj = load_checkpoint_file(path)
    sd = official_state_dict(obj, where)
    cfg, facts = infer_official_config(sd, overrides, where)
    n_cls = facts["num_classes"] or num_classes
    if n_cls is None:
        raise CheckpointError(f"{where} has no classifier.weight: pass the number of classes (num_classes)")
    model = build_model(cfg, facts["in_channels"], 32 if cfg.model.cifar_stem == "true" else 224, n_cls)
    ours = {re.sub(r"^(projector|gating_head)\.", r"\1.net.", k): v for k, v in sd.items()}  # one deeper
    if facts["num_classes"] is None:
        ours.update({k: v for k, v in model.state_dict().items() if k.startswith("classifier.")})
    try:
        what = "the architecture inferred from its shapes" + (" and the overrides" if overrides else "")
        load_state_strict(model, ours, where, f"{what} ({describe(cfg)})")
    except CheckpointError as e:
        # name the tensors as the file does (projector.0.weight, not projector.net.0.weight)
        raise CheckpointError(re.sub(r"\b(projector|gating_head)\.net\.", r"\1.", str(e))) from None
    return model.eval(), cfg

