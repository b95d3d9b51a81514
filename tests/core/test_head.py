"""The model head (issue 45): one module after the backbone builds every head a method declares
(projector, gating head, the online probe, a method's own ``Head``), for the full model and for
``bayesncl.ContrastiveHead`` alike; and each loss term declares the model outputs it reads
(``LossTerm.inputs``), checked at registration and true of what the built-in terms read."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch import nn

import bayesncl
from bayesncl.config import ConfigError, build_config
from bayesncl.core import methods
from bayesncl.core.head import ModelHead
from bayesncl.core.methods.spec import OUTPUTS, ModelOutput
from bayesncl.core.model import ContrastiveModel, build_backbone, build_model
from bayesncl.core.parts import GatingHead, Projector

TINY = ["model.proj_hidden=8", "model.proj_dim=4"]
BUILT_IN = [name for name, m in methods.METHODS.items() if m.source is None]


def _config(name: str, *more: str) -> Any:
    return build_config(overrides=[*TINY, f"method.name={name}", *more], warn_inert=False)


@pytest.mark.parametrize("name", BUILT_IN)
def test_contrastive_head_trains_every_built_in_method(name: str) -> None:
    """``bayesncl.ContrastiveHead(h_dim, cfg, num_classes=C)`` for each built-in method: a finite loss
    from two views with labels, whose gradient reaches the projector (and the method's own heads)."""
    torch.manual_seed(0)
    head = bayesncl.ContrastiveHead(6, _config(name), num_classes=3)
    h1, h2 = torch.randn(5, 6), torch.randn(5, 6)
    loss, stats = head(h1, h2, labels=torch.tensor([0, 1, 2, 0, 1]))
    assert loss.ndim == 0 and torch.isfinite(loss) and stats["loss"] == loss.detach()
    loss.backward()
    grad = head.projector.net[0].weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    for own in head.heads.values():
        assert all(p.grad is not None for p in own.parameters())
    assert set(head.heads) == set(methods.get(name).heads)


def test_contrastive_head_with_a_gate_on_a_method_with_a_head() -> None:
    """CE with the gate switched on: the classifier reads z ⊙ m, so the gating head learns too."""
    torch.manual_seed(0)
    head = bayesncl.ContrastiveHead(6, _config("ce", "method.gate=ste", "method.lam=0.1"), num_classes=3)
    loss, stats = head(torch.randn(5, 6), torch.randn(5, 6), labels=torch.tensor([0, 1, 2, 0, 1]))
    loss.backward()
    assert {"cross_entropy", "kl", "gate_open"} <= set(stats)
    assert head.gating_head is not None and head.gating_head.net[0].weight.grad.abs().sum() > 0


def test_the_model_is_a_backbone_plus_the_head_with_the_authors_names_and_rng_order() -> None:
    """Parameter names and order (checkpoints and optimiser states map onto them) and the order of the
    initial RNG draws (projector, gating head, probe, the method's heads) are the ones stored runs
    were made with; the head's state dict loads into the full model of the same config."""
    cfg = _config("ce", "method.gate=ste", "model.backbone=small_cnn")
    torch.manual_seed(3)
    model = build_model(cfg, 1, 16, 5)
    assert isinstance(model, ModelHead)
    names = [k for k in model.state_dict() if not k.startswith("backbone.")]
    assert list(model.state_dict())[0].startswith("backbone.")
    assert [k.split(".")[0] for k in names] == ["projector"] * 4 + ["gating_head"] * 4 + ["heads"] * 2 + [
        "classifier"] * 2  # fmt: skip
    torch.manual_seed(3)
    backbone, _ = build_backbone(cfg.model, 1, 16)
    projector, gating = Projector(256, 8, 4), GatingHead(256, 8, 4)
    probe, own = nn.Linear(256, 5), nn.Linear(4, 5)
    by_hand = [*backbone.state_dict().values(), *projector.state_dict().values(),
               *gating.state_dict().values(), *own.state_dict().values(), *probe.state_dict().values()]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), by_hand, strict=True))
    head = bayesncl.ContrastiveHead(256, cfg, num_classes=5)
    result = model.load_state_dict(head.state_dict(), strict=False)
    assert not result.unexpected_keys
    assert {k.split(".")[0] for k in result.missing_keys} == {"backbone", "classifier"}


def test_the_online_probe_belongs_to_the_full_model_only() -> None:
    cfg = _config("ncl")
    assert not hasattr(bayesncl.ContrastiveHead(6, cfg), "classifier")
    model = ContrastiveModel(nn.Flatten(), 6, cfg.model, cfg.method, 3)
    assert model.classifier.out_features == 3 and model.h_dim == 6


# ----------------------------------------------------------------------------- LossTerm.inputs
class _Recording:
    """A ModelOutput that records which of its fields are read (``heads.NAME`` for one head's)."""

    def __init__(self, out: ModelOutput) -> None:
        self._out, self.read = out, set()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._out, name)
        if name == "heads":
            read = self.read

            class Heads(dict):
                def __getitem__(self, key: str) -> Any:
                    read.add(f"heads.{key}")
                    return super().__getitem__(key)

            return Heads(value)
        self.read.add(name)
        return value


@pytest.mark.parametrize("name", [*BUILT_IN, "ce+gate", "ncl-scl+gate"])
def test_each_built_in_term_reads_only_the_outputs_it_declares(name: str) -> None:
    name, _, gated = name.partition("+")
    cfg = _config(name, *(["method.gate=ste"] if gated else []))
    torch.manual_seed(0)
    out = ModelHead(6, cfg.model, cfg.method, num_classes=3).project(torch.randn(10, 6))
    batch = methods.Batch(labels=torch.tensor([0, 1, 2, 0, 1]), index=None, gather=False)
    for term in methods.terms(cfg.method):
        assert term.inputs, f"{term.name} declares no inputs"
        assert set(term.inputs) <= {*OUTPUTS, *(f"heads.{h}" for h in methods.get(name).heads)}
        seen = _Recording(out)
        term.fn(seen, batch, cfg.method)  # type: ignore[arg-type]
        assert seen.read and seen.read <= set(term.inputs), (term.name, seen.read)


def _term(*inputs: str) -> methods.LossTerm:
    return methods.LossTerm("extra", lambda out, batch, m: out.z.sum() * 0, inputs=inputs)


TERM = "method 'test-inputs': its loss term 'extra' reads out."


@pytest.mark.parametrize(("inputs", "gateable", "message"), [
    (("zz",), True, "zz, which is no model output (expected one of h, p, z, logits, alpha, mask, z_tilde, "
                    "ipw_weights, heads, or heads.NAME)"),
    (("z.x",), True, "z.x, which is no model output"),
    (("heads.",), True, "heads., which is no model output"),
    (("heads.cls",), True, "heads.cls, a head the method does not declare (its heads: none)"),
    (("alpha",), False, "alpha, a gate's output, but the method cannot have a gate (gateable=False)"),
])  # fmt: skip
def test_a_term_reading_an_output_the_model_cannot_give_is_refused_at_registration(
    registry: None, inputs: tuple[str, ...], gateable: bool, message: str
) -> None:
    """One ConfigError line when the method registers (built-in and from a user's file alike)."""
    method = methods.Method("test-inputs", terms=(methods.INFO_NCE, _term(*inputs)),
                            stats=methods.CONTRASTIVE_STATS, gateable=gateable)
    for register in (methods.register_method, bayesncl.register_method):
        with pytest.raises(ConfigError) as e:
            register(method)
        assert str(e.value).startswith(TERM + message) and "\n" not in str(e.value)
    assert "test-inputs" not in methods.METHODS
    ok = dataclasses.replace(method, terms=(methods.INFO_NCE, _term("z", "heads.cls")), gateable=True,
                             heads={"cls": methods.Head(lambda d, c: nn.Linear(d, c))})
    bayesncl.register_method(ok)  # the same names, declared right
    assert methods.get("test-inputs").terms[1].inputs == ("z", "heads.cls")


@pytest.mark.parametrize("inputs", ["z_tilde", None, ("z", 1)])
def test_inputs_that_are_not_a_tuple_of_names_are_refused(registry: None, inputs: Any) -> None:
    """``inputs="z_tilde"`` (a string, not a tuple) is named as such, not read letter by letter
    (it said "reads out._, which is no model output")."""
    term = methods.LossTerm("extra", lambda out, batch, m: out.z.sum() * 0, inputs=inputs)
    method = methods.Method("test-inputs", terms=(methods.INFO_NCE, term), stats=methods.CONTRASTIVE_STATS)
    with pytest.raises(ConfigError) as e:
        bayesncl.register_method(method)
    assert str(e.value) == (f"method 'test-inputs': its loss term 'extra' has inputs={inputs!r}; expected a "
                            "tuple of output names, e.g. inputs=('z_tilde',)")


class _Raises(nn.Module):
    def __init__(self, dim: int, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("shape mismatch\nsecond line")


@pytest.mark.parametrize(("build", "raised"), [
    (lambda d, c: 1 / 0, "ZeroDivisionError on a test batch: division by zero"),
    (lambda d, c: 42, "TypeError on a test batch: int is not a Module subclass"),
    (_Raises, "RuntimeError on a test batch: shape mismatch"),
])  # fmt: skip
def test_a_head_that_fails_is_refused_in_one_line_naming_it(registry: None, build: Any, raised: str) -> None:
    """A ``Head`` whose build or forward raises: one ConfigError line from ``bayesncl.register_method``
    naming the method and its heads (it escaped as the head's own exception)."""
    term = methods.LossTerm("cls", lambda out, batch, m: out.heads["cls"].mean(), inputs=("heads.cls",))
    method = methods.Method("test-head", terms=(methods.INFO_NCE, term), stats=methods.CONTRASTIVE_STATS,
                            heads={"cls": methods.Head(build)})
    with pytest.raises(ConfigError) as e:
        bayesncl.register_method(method)
    assert str(e.value) == f"method 'test-head': its model head (heads: cls) raises {raised}"
    assert "test-head" not in methods.METHODS


@pytest.mark.parametrize("name", ["supcon", "ce"])
def test_contrastive_head_of_a_supervised_method_without_labels_is_one_line(name: str) -> None:
    """``head(h1, h2)`` for a method that learns from labels: a ConfigError saying how to pass them
    (it was a bare AssertionError inside the loss term)."""
    head = bayesncl.ContrastiveHead(6, _config(name), num_classes=3)
    with pytest.raises(ConfigError) as e:
        head(torch.randn(4, 6), torch.randn(4, 6))
    assert str(e.value) == (f"method {name!r} learns from labels: pass them, head(h1, h2, labels=y) with "
                            "y (n,) the images' classes")
