"""Precision chosen for the hardware (issue 23): native-bf16 detection, ``train.precision=fast``
(bf16 autocast + channels-last on a CPU with AVX512-BF16 or AMX, fp32 elsewhere), what stays fp32,
what the log says, and a run's identity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bayesncl.app.train import pretrain
from bayesncl.config import build_config
from bayesncl.core import optim
from bayesncl.core.optim import cpu_flags, native_cpu_bf16, precision_plan, resolve_precision
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


@pytest.mark.parametrize("native", ["AVX512-BF16", None])
def test_fast_is_bf16_and_channels_last_only_on_a_native_bf16_cpu(
    monkeypatch: pytest.MonkeyPatch, native: str | None
) -> None:
    _native(monkeypatch, native)
    fast = precision_plan("fast", False, CPU)
    assert fast.dtype == (torch.bfloat16 if native else None)
    assert fast.channels_last is bool(native)
    assert fast.why.startswith("bf16 autocast + channels-last (" if native else "fp32 (")
    assert ("has AVX512-BF16" in fast.why) is bool(native)
    # the defaults keep today's fp32 on every CPU; explicit values are as asked
    auto = precision_plan("auto", False, CPU)
    assert auto.dtype is None and not auto.channels_last and auto.why.startswith("fp32 (")
    assert ("train.precision=fast would use bf16" in auto.why) is bool(native)
    assert resolve_precision("fp32", CPU) is None and resolve_precision("bf16", CPU) == torch.bfloat16
    assert precision_plan("fp32", True, CPU).channels_last  # train.channels_last is kept


def test_identity_tells_a_bf16_run_from_an_fp32_one(monkeypatch: pytest.MonkeyPatch) -> None:
    cfgs = {p: build_config(overrides=[*TINY, f"train.precision={p}"]) for p in ("auto", "fp32", "fast")}
    _native(monkeypatch, "AVX512-BF16")
    assert identity(cfgs["fast"])["train.precision"] == "fast:bf16"
    bf16 = variant_hash(cfgs["fast"])
    _native(monkeypatch, None)
    assert identity(cfgs["fast"])["train.precision"] == "fast:fp32"
    fp32 = variant_hash(cfgs["fast"])
    assert len({bf16, fp32, variant_hash(cfgs["auto"]), variant_hash(cfgs["fp32"])}) == 4
    assert identity(cfgs["auto"])["train.precision"] == "auto"  # stored runs keep their names


def test_fast_run_trains_bf16_channels_last_with_fp32_loss_and_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tiny BayesNCL run under ``fast`` on a (reported) native-bf16 CPU: the log says so, the
    convolutions ran in bf16 on channels-last tensors, while the loss, the KL, the statistics, the
    weights and LARS's momentum stay fp32 (dino #58)."""
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
    cfg = build_config(overrides=[*TINY, "method.name=bayesncl", "train.precision=fast"])
    pretrain(cfg, run, evaluate=False)
    out = capsys.readouterr().out
    assert "precision: bf16 autocast + channels-last (train.precision=fast: this CPU has AVX512-BF16)" in out
    assert seen and all(d == torch.bfloat16 and cl for d, cl in seen)
    assert losses and all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in losses)
    ckpt = torch.load(run / "last.pt", map_location="cpu", weights_only=False)
    floats = [v for v in ckpt["state_dict"].values() if v.is_floating_point()]
    assert floats and all(v.dtype == torch.float32 for v in floats)
    momenta = [s["momentum_buffer"] for s in ckpt["optimizer"]["state"].values() if "momentum_buffer" in s]
    assert momenta and all(m.dtype == torch.float32 for m in momenta)


def test_auto_on_a_native_bf16_cpu_stays_fp32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _native(monkeypatch, "AVX512-BF16")
    pretrain(build_config(overrides=TINY), tmp_path / "run", evaluate=False)
    assert "precision: fp32 (train.precision=auto: this CPU has AVX512-BF16; train.precision=fast would" \
        in capsys.readouterr().out


def test_a_fast_run_is_extracted_as_it_trained(monkeypatch: pytest.MonkeyPatch) -> None:
    """Extraction of a ``fast`` run runs its convolutions in bf16 on channels-last input and returns
    float32 features within bf16's rounding of the fp32 ones; any other run is extracted in fp32."""
    from bayesncl.app.evaluate import extract_split
    from bayesncl.core.model import build_model

    _native(monkeypatch, "AVX512-BF16")
    fast = build_config(overrides=[*TINY, "method.name=bayesncl", "train.precision=fast"])
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
    full = extract_split(model, build_config(overrides=[*TINY, "method.name=bayesncl"]), "test", CPU)
    assert convs and all(d == torch.float32 and not cl for d, cl in convs)
    assert low["h"].dtype == full["h"].dtype == np.float32 and low["h"].shape == full["h"].shape == (60, 256)
    scale = float(np.abs(full["h"]).max())
    assert float(np.abs(low["h"] - full["h"]).max()) <= 0.05 * scale
    assert not np.array_equal(low["h"], full["h"])
