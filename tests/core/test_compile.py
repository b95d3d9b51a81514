"""``train.compile`` (issue 46): the compiled step (forward + loss + statistics,
``core.engine.compiled_loss``) computes what the eager one does, resumes bit for bit, keeps the
checkpoint's keys, stays out of a run's identity; and the step and the resident loader never read a
device tensor on the host (a sync on CUDA).

torch.compile's inductor runs here (gcc), but its first compile of even the tiny model took ~190 s on the
2 shared cores: the fast tests compile with ``backend="aot_eager"`` (dynamo's graph capture and AOTAutograd's
forward/backward split, run by eager kernels), the inductor comparison is marked slow. CUDA graphs, pinned
memory and the absence of syncs on a real GPU are left to ``benchmarks/gpu_check.sh``. "No host read" is
tested structurally: the step and the loader run on the ``meta`` device, where ``.item()``, ``bool()``,
``.tolist()``, ``nonzero`` and any copy of a device tensor's values to the host raise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import bayesncl.core.engine as engine_module
import bayesncl.runs.rundir as rundir_module
from bayesncl.app.train import pretrain
from bayesncl.config import build_config
from bayesncl.config.parse import diff_configs
from bayesncl.core import methods
from bayesncl.core.distributed import World
from bayesncl.core.engine import (
    compile_plan,
    compiled_loss,
    contrastive_loss_fn,
    train_step,
    wrap_for_training,
)
from bayesncl.core.model import build_model
from bayesncl.core.optim import build_optimizer, param_groups, peak_lrs
from bayesncl.runs.safe_load import load_checkpoint_file

from ..conftest import TINY, TINY_BASE, assert_same_weights, signal_at

CPU = torch.device("cpu")


@pytest.fixture
def aot_eager(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """torch.compile with ``backend="aot_eager"`` wherever the package calls it; returns the calls'
    keyword arguments."""
    real, calls = torch.compile, []

    def compile_(fn: Any = None, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(fn, **{**kwargs, "backend": "aot_eager"})

    monkeypatch.setattr(torch, "compile", compile_)
    torch._dynamo.reset()
    return calls


def test_compile_plan_auto_is_on_for_cuda_only() -> None:
    cuda, meta = torch.device("cuda", 0), torch.device("meta")
    assert [compile_plan(s, CPU) for s in ("auto", "true", "false", True, False)] == [
        False, True, False, True, False,
    ]
    assert [compile_plan(s, cuda) for s in ("auto", "true", "false")] == [True, True, False]
    assert compile_plan("auto", meta) is False
    assert build_config().train.compile == "auto" and build_config().train.compile_mode == "default"
    assert build_config(overrides=["train.compile=True"]).train.compile == "true"  # a YAML bool too


def test_compile_off_keeps_the_eager_step() -> None:
    finetune = object()
    for cfg in (build_config(overrides=[*TINY, "train.compile=false"]), build_config(overrides=TINY)):  # auto
        assert compiled_loss(cfg, World(device=CPU), finetune) is finetune  # type: ignore[arg-type]


def _steps(overrides: list[str], n: int, *, compiled: bool) -> tuple[list[dict[str, float]], dict[str, Any]]:
    """n training steps of the tiny model from seed 0 on fixed random batches: each step's statistics
    and the final state_dict; the loss compiled (``compiled_loss``) or eager."""
    cfg = build_config(overrides=[*TINY, *overrides, f"train.compile={str(compiled).lower()}"])
    torch.manual_seed(0)
    model = build_model(cfg, 3, 16, 10)
    if cfg.train.precision == "bf16":
        model = model.to(memory_format=torch.channels_last)
    opt = build_optimizer(param_groups(model, cfg, peak_lrs(cfg, 32)), cfg)
    world = World(device=CPU)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if cfg.train.precision == "bf16" else None
    eager = contrastive_loss_fn(methods.get(cfg.method.name), cfg.method, autocast=autocast,
                                channels_last=autocast is not None)  # fmt: skip
    step_model, loss_fn = wrap_for_training(model, cfg, world), compiled_loss(cfg, world, eager)
    assert (loss_fn is not eager) == compiled
    g, out = torch.Generator().manual_seed(1), []
    for i in range(n):
        x1, x2 = torch.randn(32, 3, 16, 16, generator=g), torch.randn(32, 3, 16, 16, generator=g)
        y = torch.randint(0, 10, (32,), generator=g)
        torch.manual_seed(100 + i)  # the Gumbel noise
        stats = train_step(step_model, opt, scaler, (x1, x2, y), loss_fn)
        out.append({k: float(v) for k, v in stats.items()})
    return out, model.state_dict()


Steps = tuple[list[dict[str, float]], dict[str, Any]]


def _assert_close(a: Steps, b: Steps, atol: float, rtol: float = 0.0, weights: float | None = None) -> None:
    """Statistics within ``atol + rtol * |value|``, weights within ``weights`` (default ``atol``), the
    same keys."""
    (stats_a, w_a), (stats_b, w_b) = a, b
    assert stats_a[0].keys() == stats_b[0].keys() and len(stats_a) == len(stats_b)
    for sa, sb in zip(stats_a, stats_b, strict=True):
        assert all(abs(sa[k] - sb[k]) <= atol + rtol * abs(sa[k]) for k in sa), (sa, sb)
    assert w_a.keys() == w_b.keys()  # no "_orig_mod." prefix: the model itself is never compiled
    assert not any("_orig_mod" in k for k in w_b)
    for k, v in w_a.items():
        if v.is_floating_point():
            torch.testing.assert_close(w_b[k], v, atol=atol if weights is None else weights, rtol=0, msg=k)
        else:
            assert torch.equal(w_b[k], v), k  # BatchNorm's num_batches_tracked


@pytest.mark.slow  # ~30 s each on 2 busy cores, most of it tracing
@pytest.mark.parametrize("method", ["cl", "bayesncl"])
def test_compiled_step_equals_the_eager_one_fp32(method: str, aot_eager: list[dict[str, Any]]) -> None:
    """Three LARS steps: the same statistics (loss, InfoNCE, KL, gate open rate, ...) and weights
    within fp32 rounding; one compile of the whole forward + loss (mode None: ``default``)."""
    over = [f"method.name={method}", "train.precision=fp32", *(["method.lam=0.01"] * (method != "cl"))]
    eager = _steps(over, 3, compiled=False)
    compiled = _steps(over, 3, compiled=True)
    _assert_close(eager, compiled, atol=1e-6)
    assert aot_eager == [{"mode": None}]
    assert abs(eager[0][0]["loss"] - eager[0][2]["loss"]) > 1e-4  # the steps did train


@pytest.mark.slow  # ~30 s
def test_compiled_step_equals_the_eager_one_bf16(aot_eager: list[dict[str, Any]]) -> None:
    """bf16 autocast + channels-last traced into the graph: the same as eager bf16 within bf16's
    rounding: statistics within 1 % (bf16 keeps 8 bits: 2^-8 = 0.4 % per rounding; measured 0.25 % on
    the loss, the traced graph rounds its matmuls' intermediates otherwise), the fp32 weights within
    5e-3 after 2 steps (measured: 3.6e-3 at most, 2-8 % of each tensor's update, bf16's gradient noise)."""
    over = ["method.name=bayesncl", "method.lam=0.01", "train.precision=bf16"]
    _assert_close(_steps(over, 2, compiled=False), _steps(over, 2, compiled=True), atol=1e-6, rtol=1e-2,
                  weights=5e-3)


@pytest.mark.slow
def test_inductor_compiled_step_equals_the_eager_one_fp32() -> None:
    """torch.compile's own backend (inductor: generated C++ kernels here, Triton on CUDA), fp32: within
    1e-5 after 2 steps (measured: losses equal, weights within 1.4e-6 after 3 steps). ~3 min on 2 busy
    cores, most of it compiling."""
    torch._dynamo.reset()
    over = ["method.name=bayesncl", "method.lam=0.01", "train.precision=fp32"]
    _assert_close(_steps(over, 2, compiled=False), _steps(over, 2, compiled=True), atol=1e-5)


def test_cuda_graph_modes_mark_each_step(
    monkeypatch: pytest.MonkeyPatch, aot_eager: list[dict[str, Any]]
) -> None:
    """reduce-overhead (CUDA graphs) marks a new step before each call, so that a step's outputs are
    not read after the next replay overwrote them; the mode reaches torch.compile."""
    marks: list[int] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    cfg = build_config(overrides=[*TINY, "train.compile=true", "train.compile_mode=reduce-overhead"])
    fn = compiled_loss(cfg, World(device=CPU), lambda model, batch: (torch.zeros(()), {}))
    fn(None, ())  # type: ignore[arg-type]
    fn(None, ())  # type: ignore[arg-type]
    assert marks == [1, 1] and aot_eager == [{"mode": "reduce-overhead"}]


@pytest.mark.slow  # ~80 s: three compiled runs and an eager one
def test_resume_with_compile_is_bit_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, aot_eager: list[dict[str, Any]]
) -> None:
    """A compiled run stopped inside epoch 2 and resumed (compiled again) ends with the weights of an
    uninterrupted compiled run, bit for bit; its checkpoint holds the model's own keys (no
    ``_orig_mod.``), the same as an eager run's, whose weights it matches to fp32 rounding."""
    args = [*TINY_BASE, "method.name=bayesncl", "method.lam=0.01", "train.precision=fp32", "train.epochs=2"]
    on = [*args, "train.compile=true"]
    straight, run, eager = tmp_path / "straight", tmp_path / "run", tmp_path / "eager"
    pretrain(build_config(overrides=on), straight, evaluate=False)
    with monkeypatch.context() as m:
        signal_at(m, engine_module, "train_step", (5,))  # inside epoch 2
        with pytest.raises(rundir_module.TrainingInterrupted, match="stopped in epoch 2"):
            pretrain(build_config(overrides=on), run, evaluate=False)
    pretrain(build_config(overrides=on), run, resume=True, evaluate=False)
    assert_same_weights(straight / "last.pt", run / "last.pt")
    pretrain(build_config(overrides=[*args, "train.compile=false"]), eager, evaluate=False)
    a, b = (load_checkpoint_file(r / "last.pt")["state_dict"] for r in (eager, run))
    assert list(a) == list(b) and not any("_orig_mod" in k for k in b)
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-5, rtol=0, msg=k)
    assert len(aot_eager) == 3  # the straight run, the stopped one and its resume compiled the step


def test_compile_is_out_of_the_identity_and_free_on_resume() -> None:
    """A compiled run is the same run as an eager one (fp32 rounding apart): same store name,
    resumable either way, left out of a table's named overrides; the name of an eager run is the one
    it had before the key became ``auto``."""
    from bayesncl.paper.variants import identity, named_overrides, variant_hash

    base = build_config(overrides=TINY)
    others = [build_config(overrides=[*TINY, f"train.compile={v}", f"train.compile_mode={m}"])
              for v in ("true", "false", "auto") for m in ("default", "reduce-overhead")]
    assert {variant_hash(c) for c in others} == {variant_hash(base)}
    assert identity(base)["train.compile"] is False and "train.compile_mode" not in identity(base)
    assert diff_configs(base, others[0]) == []
    assert named_overrides(["train.compile=true", "train.compile_mode=max-autotune", "method.rho=0.5"]) == [
        "method.rho=0.5"
    ]


# ----------------------------------------------------------------------------- no host synchronisation
def _meta_step(method: str, loss_fn: Any = None) -> dict[str, torch.Tensor]:
    cfg = build_config(overrides=[*TINY, f"method.name={method}", "train.precision=fp32"])
    with torch.device("meta"):
        model = build_model(cfg, 3, 16, 10)
    opt = build_optimizer(param_groups(model, cfg, peak_lrs(cfg, 32)), cfg)
    step_model = wrap_for_training(model, cfg, World(device=CPU))
    x = torch.empty(32, 3, 16, 16, device="meta")
    y = torch.zeros(32, dtype=torch.long, device="meta")
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    loss_fn = loss_fn or contrastive_loss_fn(methods.get(cfg.method.name), cfg.method)
    return train_step(step_model, opt, scaler, (x, x, y), loss_fn)


@pytest.mark.parametrize("method", ["cl", "ncl", "bayesncl", "ncl-topk"])
def test_the_step_reads_no_device_tensor_on_the_host(method: str) -> None:
    """Forward, gate, loss, statistics, backward and the LARS step run on the ``meta`` device (no
    values): nothing in them reads a device tensor on the host, which on CUDA is a synchronisation."""
    stats = _meta_step(method)
    assert stats and all(v.device.type == "meta" for v in stats.values())


def test_a_host_read_in_the_step_is_caught_on_meta() -> None:
    """The check above can fail: a loss that reads its value with ``.item()`` (as a logging line
    might) raises on the meta device."""
    def item_reading_loss(step_model: Any, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, stats = engine_module.forward_loss(step_model, *batch, build_config(overrides=TINY).method)
        if loss.item() > 1e9:
            raise AssertionError("unreachable")
        return loss, stats

    with pytest.raises((RuntimeError, NotImplementedError)):
        _meta_step("bayesncl", item_reading_loss)


def test_the_resident_loader_reads_no_device_tensor_on_the_host() -> None:
    """The batched augmentation (kornia crop, jitter, grayscale, the PIL blur, flip) and the batch
    indexing run on the ``meta`` device: with the blur's kernels built there, no step of the loader
    waits for the device (on an H200 the host-built kernels were 2 syncs a step)."""
    from bayesncl.data.augment import AugmentSpec
    from bayesncl.data.loaders import ResidentTwoViewLoader

    spec = AugmentSpec.simclr(16, 3, (0.5,) * 3, (0.25,) * 3, blur_prob=1.0)
    images = torch.randint(0, 255, (64, 3, 16, 16), dtype=torch.uint8)
    meta = torch.device("meta")
    loader = ResidentTwoViewLoader(images, torch.arange(64) % 10, 16, spec, seed=0, device=meta)
    batches = list(loader)
    assert len(batches) == 4 and all(t.device.type == "meta" for b in batches for t in b)


def test_blur_kernels_are_built_on_the_device_and_blur_as_the_host_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The device path builds its kernels from sigma on x's device, and blurs the chosen rows as the
    host path does (the CPU's, unchanged) and leaves the others as they were."""
    import bayesncl.data.augment as augment

    blur = augment._PilBlur((0.1, 2.0), 0.5)
    x = torch.rand(8, 3, 12, 12, generator=torch.Generator().manual_seed(0))
    chosen = torch.tensor([True, False, True, True, False, False, True, False])
    sigma = torch.linspace(0.1, 2.0, 8, dtype=torch.float64)
    host = blur._host(x, chosen, sigma)
    seen: list[torch.device] = []
    real = augment.pil_box_kernels
    monkeypatch.setattr(augment, "pil_box_kernels", lambda s, m: seen.append(s.device) or real(s, m))
    device = blur._on_device(x, chosen, sigma)
    assert seen == [x.device]
    torch.testing.assert_close(device, host, atol=1e-6, rtol=0)
    assert torch.equal(device[~chosen], x[~chosen])
    assert not torch.allclose(device[chosen], x[chosen], atol=1e-3)
    monkeypatch.setattr(augment, "pil_box_kernels", real)
    assert blur._on_device(x.to("meta"), chosen, sigma).device.type == "meta"


def test_the_cpu_blur_path_is_the_one_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU the blur keeps the host path (the digits of every CPU run); the device path is used
    for other devices only."""
    import bayesncl.data.augment as augment

    calls: list[str] = []
    blur = augment._PilBlur((0.1, 2.0), 1.0)
    monkeypatch.setattr(blur, "_host", lambda x, c, s: calls.append("host") or x)
    monkeypatch.setattr(blur, "_on_device", lambda x, c, s: calls.append("device") or x)
    blur(torch.rand(4, 3, 8, 8))
    blur(torch.empty(4, 3, 8, 8, device="meta"))
    assert calls == ["host", "device"]
