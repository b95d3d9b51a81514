"""Precision chosen for the hardware (issue 23): native-bf16 detection, ``train.precision=auto`` (the
default) and its alias ``fast`` (bf16 autocast + channels-last on a CPU with AVX512-BF16 or AMX, fp32
on other CPUs, the CUDA choice as before), what stays fp32, what the log says, and a run's identity.
Every test here forces the detection (:func:`_native`), so it passes on either kind of CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bayesncl.app.train import pretrain
from bayesncl.config import build_config
from bayesncl.core import optim
from bayesncl.core.optim import Precision, cpu_flags, native_cpu_bf16, precision_plan, resolve_precision
from bayesncl.paper.variants import identity, variant_hash

from ..conftest import TINY

CPU = torch.device("cpu")


def _native(monkeypatch: pytest.MonkeyPatch, name: str | None) -> None:
    monkeypatch.setattr(optim, "native_cpu_bf16", lambda flags=None: name)


def test_native_bf16_needs_the_cpu_flag_and_torch_avx512_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True, raising=False)
    assert native_cpu_bf16({"avx512f", "avx512bw", "avx512_bf16"}) == "AVX512-BF16"
    assert native_cpu_bf16({"avx512_bf16", "amx_bf16", "amx_tile"}) == "AMX-BF16"
    assert native_cpu_bf16({"avx512f", "avx512bw", "avx2"}) is None  # AVX-512 alone: bf16 is emulated
    assert native_cpu_bf16(set()) is None
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")  # ATEN_CPU_CAPABILITY=avx2
    assert native_cpu_bf16({"avx512_bf16"}) is None


def test_cpu_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu sse2 avx512_bf16\n\nflags\t: other\n")
    assert cpu_flags(str(info)) == {"fpu", "sse2", "avx512_bf16"}
    assert cpu_flags(str(tmp_path / "absent")) == frozenset()


@pytest.mark.parametrize("name", ["auto", "fast"])
@pytest.mark.parametrize("native", ["AVX512-BF16", None])
def test_auto_is_bf16_and_channels_last_only_on_a_native_bf16_cpu(
    monkeypatch: pytest.MonkeyPatch, native: str | None, name: str
) -> None:
    _native(monkeypatch, native)
    plan = precision_plan(name, False, CPU)
    assert plan.dtype == (torch.bfloat16 if native else None)
    assert plan.channels_last is bool(native)
    assert plan.why == (
        f"bf16 autocast + channels-last (train.precision={name}: this CPU has AVX512-BF16)" if native else
        f"fp32 (train.precision={name}: this CPU has no native bf16 (AVX512-BF16 or AMX))"
    )
    # explicit values are as asked, on either CPU
    assert resolve_precision("fp32", CPU) is None and resolve_precision("bf16", CPU) == torch.bfloat16
    assert precision_plan("fp32", False, CPU) == Precision(None, False, "fp32 (train.precision=fp32 on cpu)")
    assert precision_plan("fp32", True, CPU).channels_last  # train.channels_last is kept
    assert not precision_plan("bf16", False, CPU).channels_last
    # an explicit bf16 says when this CPU only emulates it (~12x slower than fp32 on an AVX2 EPYC)
    emulated = "no native bf16 on this CPU, emulated and several times slower than fp32 (auto: fp32 here)"
    assert (emulated in precision_plan("bf16", False, CPU).why) is (native is None)


@pytest.mark.parametrize("bf16", [True, False])
def test_on_cuda_auto_is_as_before_and_fast_adds_channels_last(
    monkeypatch: pytest.MonkeyPatch, bf16: bool
) -> None:
    """CUDA: ``auto`` is bf16 where the GPU supports it, else fp16, in the memory format
    ``train.channels_last`` says; ``fast`` adds channels-last. The CPU's bf16 does not matter there."""
    _native(monkeypatch, "AVX512-BF16")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    cuda, dtype = torch.device("cuda"), torch.bfloat16 if bf16 else torch.float16
    name = "bf16" if bf16 else "fp16"
    assert precision_plan("auto", False, cuda) == Precision(
        dtype, False, f"{name} autocast (train.precision=auto on cuda)"
    )
    assert precision_plan("auto", True, cuda).channels_last
    assert precision_plan("fast", False, cuda) == Precision(
        dtype, True, f"{name} autocast + channels-last (train.precision=fast on cuda)"
    )


def test_identity_tells_a_bf16_run_from_an_fp32_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` that resolves to bf16 on a CPU is ``auto:bf16``; ``auto`` that resolves to fp32 keeps
    the name ``auto`` every stored fp32 run has; ``fast`` is held with what it resolves to."""
    cfgs = {p: build_config(overrides=[*TINY, f"train.precision={p}"]) for p in ("auto", "fp32", "fast")}
    _native(monkeypatch, "AVX512-BF16")
    held = {p: identity(c)["train.precision"] for p, c in cfgs.items()}
    assert held == {"auto": "auto:bf16", "fp32": "fp32", "fast": "fast:bf16"}
    bf16 = {p: variant_hash(c) for p, c in cfgs.items()}
    _native(monkeypatch, None)
    held = {p: identity(c)["train.precision"] for p, c in cfgs.items()}
    assert held == {"auto": "auto", "fp32": "fp32", "fast": "fast:fp32"}  # stored runs keep their names
    fp32 = {p: variant_hash(c) for p, c in cfgs.items()}
    assert fp32["fp32"] == bf16["fp32"]
    assert len({*bf16.values(), *fp32.values()}) == 5  # auto:bf16, fast:bf16, auto, fast:fp32, fp32
    # on CUDA, auto is bf16 or fp16, never the name of an fp32 CPU run (a store shared between a GPU
    # machine and an AVX2 CPU would otherwise reuse one's runs as the other's)
    on_cuda = build_config(overrides=[*TINY, "train.device=cuda"])
    anywhere = build_config(overrides=[*TINY, "train.device=auto"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    on_cpu = variant_hash(anywhere)  # no CUDA, no native bf16: fp32, held as plain auto
    assert identity(on_cuda)["train.precision"] == "auto:cuda"  # refused when the run starts
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # train.device=auto now means CUDA
    for bf16_ok, held_on_cuda in ((True, "auto:bf16"), (False, "auto:fp16")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda ok=bf16_ok: ok)
        assert identity(on_cuda)["train.precision"] == held_on_cuda
        assert identity(anywhere)["train.precision"] == held_on_cuda
        assert variant_hash(anywhere) != on_cpu  # the same config, stored on a CPU without bf16


@pytest.mark.slow
@pytest.mark.parametrize("name", ["auto", "fast"])
def test_auto_run_trains_bf16_channels_last_with_fp32_loss_and_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """A tiny BayesNCL run under ``auto`` (the default) or ``fast`` on a (reported) native-bf16 CPU:
    the log says so, the convolutions ran in bf16 on channels-last tensors, while the loss, the KL,
    the statistics, the weights and LARS's momentum stay fp32 (dino #58)."""
    from bayesncl.core.engine import forward_loss

    _native(monkeypatch, "AVX512-BF16")
    seen: list[tuple[torch.dtype, bool]] = []
    real_conv = torch.nn.Conv2d._conv_forward

    def conv(self: torch.nn.Conv2d, x: torch.Tensor, *args: object) -> torch.Tensor:
        out = real_conv(self, x, *args)
        if torch.is_grad_enabled():  # a training step (the epoch-end held-out monitor runs without)
            seen.append((out.dtype, x.is_contiguous(memory_format=torch.channels_last)))
        return out

    monkeypatch.setattr(torch.nn.Conv2d, "_conv_forward", conv)
    losses: list[torch.Tensor] = []

    def spy(*args: object, **kwargs: object) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, stats = forward_loss(*args, **kwargs)  # type: ignore[arg-type]
        losses.extend(stats.values())
        losses.append(loss)
        return loss, stats

    monkeypatch.setattr("bayesncl.core.engine.forward_loss", spy)
    run = tmp_path / "run"
    cfg = build_config(overrides=[*TINY, "method.name=bayesncl", f"train.precision={name}"])
    pretrain(cfg, run, evaluate=False)
    out = capsys.readouterr().out
    said = f"precision: bf16 autocast + channels-last (train.precision={name}: this CPU has AVX512-BF16)"
    assert said in out
    assert seen and all(d == torch.bfloat16 and cl for d, cl in seen)
    assert losses and all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in losses)
    ckpt = torch.load(run / "last.pt", map_location="cpu", weights_only=False)
    floats = [v for v in ckpt["state_dict"].values() if v.is_floating_point()]
    assert floats and all(v.dtype == torch.float32 for v in floats)
    momenta = [s["momentum_buffer"] for s in ckpt["optimizer"]["state"].values() if "momentum_buffer" in s]
    assert momenta and all(m.dtype == torch.float32 for m in momenta)


@pytest.mark.slow
def test_auto_on_a_cpu_without_native_bf16_is_fp32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _native(monkeypatch, None)
    seen: list[torch.dtype] = []
    real_conv = torch.nn.Conv2d._conv_forward

    def conv(self: torch.nn.Conv2d, x: torch.Tensor, *args: object) -> torch.Tensor:
        out = real_conv(self, x, *args)
        seen.append(out.dtype)
        return out

    monkeypatch.setattr(torch.nn.Conv2d, "_conv_forward", conv)
    pretrain(build_config(overrides=TINY), tmp_path / "run", evaluate=False)
    assert "precision: fp32 (train.precision=auto: this CPU has no native bf16 (AVX512-BF16 or AMX))" \
        in capsys.readouterr().out
    assert seen and set(seen) == {torch.float32}


@pytest.mark.parametrize("name", ["auto", "fast"])
def test_a_bf16_run_is_extracted_as_it_trained(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Extraction of an ``auto`` or ``fast`` run on a native-bf16 CPU runs its convolutions in bf16 on
    channels-last input and returns float32 features within bf16's rounding of the fp32 ones; an
    fp32 run is extracted in fp32, and so is an ``auto`` run on a CPU without native bf16."""
    from bayesncl.app.evaluate import extract_split
    from bayesncl.core.model import build_model

    _native(monkeypatch, "AVX512-BF16")
    fast = build_config(overrides=[*TINY, "method.name=bayesncl", f"train.precision={name}"])
    torch.manual_seed(0)
    model = build_model(fast, 3, 16, 10)
    real_conv = torch.nn.Conv2d._conv_forward
    convs: list[tuple[torch.dtype, bool]] = []

    def conv(self: torch.nn.Conv2d, x: torch.Tensor, *args: object) -> torch.Tensor:
        out = real_conv(self, x, *args)
        convs.append((out.dtype, x.is_contiguous(memory_format=torch.channels_last)))
        return out

    monkeypatch.setattr(torch.nn.Conv2d, "_conv_forward", conv)
    low = extract_split(model, fast, "test", CPU)
    assert convs and all(d == torch.bfloat16 and cl for d, cl in convs)
    convs.clear()
    fp32 = build_config(overrides=[*TINY, "method.name=bayesncl", "train.precision=fp32"])
    full = extract_split(model, fp32, "test", CPU)
    assert convs and all(d == torch.float32 and not cl for d, cl in convs)
    convs.clear()
    _native(monkeypatch, None)
    elsewhere = extract_split(model, fast, "test", CPU)
    assert convs and all(d == torch.float32 and not cl for d, cl in convs)
    assert np.array_equal(elsewhere["h"], full["h"])
    assert low["h"].dtype == full["h"].dtype == np.float32 and low["h"].shape == full["h"].shape == (60, 256)
    scale = float(np.abs(full["h"]).max())
    assert float(np.abs(low["h"] - full["h"]).max()) <= 0.05 * scale
    assert not np.array_equal(low["h"], full["h"])
