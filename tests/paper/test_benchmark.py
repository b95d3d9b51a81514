"""``bayesncl benchmark`` with tiny settings: the JSON keys, sane values, exact FLOPs, bad input.

No timing assertions: this machine's speed says nothing about the code.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import pytest

from bayesncl.paper.benchmark import add_benchmark_parser, format_report, main

TINY = [
    "--device", "cpu", "--backbone", "small_cnn", "--image-size", "16", "--batch-size", "8",
    "--steps", "1", "--rounds", "2", "--warmup", "1", "model.proj_hidden=32", "model.proj_dim=16",
]  # fmt: skip
H, HIDDEN, D = 256, 32, 16  # small_cnn's h width, gate hidden (= proj_hidden), proj_dim


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bayesncl")
    add_benchmark_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["benchmark", *argv])
    return int(args.func(args))


@pytest.fixture(scope="module")
def printed() -> tuple[str, str]:
    """stdout and stderr of one ``benchmark --json`` run."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert _run(["--json", *TINY]) == 0
    return out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def result(printed: tuple[str, str]) -> dict[str, Any]:
    return json.loads(printed[0])


@pytest.mark.slow
def test_json_progress_goes_to_stderr(printed: tuple[str, str]) -> None:
    """With --json, stdout is the JSON alone and the progress lines go to stderr (a GPU check that
    timed out used to leave no trace of how far it got)."""
    out, err = printed
    assert out.lstrip().startswith("{") and "..." not in out
    lines = err.splitlines()
    assert any(line.startswith("... building 3 models") for line in lines)
    assert any(line.startswith("... round 1/") for line in lines)


@pytest.mark.slow
def test_json_has_the_documented_keys(result: dict[str, Any]) -> None:
    assert set(result["images_per_s"]) == {"cl", "ncl", "bayesncl"}
    assert set(result["flops_per_image"]) == {"ncl", "bayesncl"}
    for key in ("gate_overhead_pct", "augment_speedup", "device"):
        assert key in result
    assert result["device"] == "cpu"


@pytest.mark.slow
def test_values_are_sane(result: dict[str, Any]) -> None:
    for v in result["images_per_s"].values():
        assert math.isfinite(v) and v > 0
    assert math.isfinite(result["gate_overhead_pct"]) and -90 < result["gate_overhead_pct"] < 1000
    assert math.isfinite(result["augment_speedup"]) and result["augment_speedup"] > 0
    assert result["per_sample_images_per_s"] > 0
    assert math.isfinite(result["augment_only_speedup"]) and result["augment_only_speedup"] > 0
    assert all(v > 0 for v in result["breakdown"].values())
    # the held-out monitor at the demo's settings: its share of a demo epoch (20,000 images)
    share = 100 * result["heldout_monitor_s"] / (20_000 / result["demo_images_per_s"])
    assert result["heldout_monitor_images"] == 2000 and result["demo_images_per_s"] > 0
    assert result["heldout_monitor_pct_of_demo_epoch"] == pytest.approx(share, abs=0.01)
    st = result["settings"]
    assert (st["backbone"], st["image_size"], st["batch_size"]) == ("small_cnn", 16, 8)
    from bayesncl.core.optim import native_cpu_bf16

    native = native_cpu_bf16() is not None  # the default is training's auto: bf16 + channels-last there
    assert (st["precision"], st["channels_last"]) == (("bf16", True) if native else ("fp32", False))


@pytest.mark.slow
def test_flops_differ_by_exactly_the_gating_head(result: dict[str, Any]) -> None:
    """FlopCounterMode counts matmuls (a multiply-add = 2 FLOPs). Per view, the 2-layer gate costs
    2·H·hidden + 2·hidden·D forward; backward, the weight gradients of both layers plus the input
    gradient of the second only (the gate reads sg(h): no gradient flows back into h)."""
    fwd = 2 * H * HIDDEN + 2 * HIDDEN * D
    bwd = 2 * H * HIDDEN + 2 * (2 * HIDDEN * D)
    f, t = result["flops_per_image"], result["train_flops_per_pair"]
    assert 0 < f["ncl"] < t["ncl"]
    assert f["bayesncl"] - f["ncl"] == pytest.approx(fwd, abs=1e-6)  # one view, forward
    assert t["bayesncl"] - t["ncl"] == pytest.approx(2 * (fwd + bwd), abs=1e-6)  # two views, fwd + bwd


def test_forward_flops_follow_the_papers_table7_convention() -> None:
    """ImageNet-100 recipe, ResNet-18 at 224 px: the paper reports 3.731 G (NCL) and 3.815 G
    (BayesNCL); their difference is the gating head (16384-wide hidden layer)."""
    from pathlib import Path

    import bayesncl
    from bayesncl.config import build_config
    from bayesncl.paper.benchmark import flops_per_image

    recipes = Path(bayesncl.__file__).parent / "configs"
    over = ["data.name=synthetic", "data.image_size=224", "data.classes="]  # shapes only: no ImageNet
    ncl = flops_per_image(build_config(recipes / "imagenet100-ncl.yaml", over)) / 1e9
    bay = flops_per_image(build_config(recipes / "imagenet100-bayesncl.yaml", over)) / 1e9
    assert ncl == pytest.approx(3.731, rel=0.01) and bay == pytest.approx(3.815, rel=0.01)
    assert bay - ncl == pytest.approx(3.815 - 3.731, abs=1e-3)


@pytest.mark.slow
def test_text_report(capsys: pytest.CaptureFixture[str], result: dict[str, Any]) -> None:
    assert _run([*TINY, "--rounds", "1", "--no-augment-compare", "--no-plain-compare"]) == 0
    out = capsys.readouterr().out
    for needle in ("images/s", "cl", "ncl", "bayesncl", "gate overhead", "FLOP", "fixed batch"):
        assert needle in out
    assert "per-sample" not in out and "plain SimCLR" not in out
    report = format_report(result)
    plain = result["plain_simclr"]
    assert f"best of 0/1/2 workers: {plain['workers']}): {plain['images_per_s']:,.1f} images/s" in report
    x = result["speedup_vs_plain_simclr"]["fp32"]["bayesncl"]
    assert "  fp32     cl " in report and f"bayesncl {x:.2f}x" in report


# ----------------------------------------------------------------------------- the plain SimCLR loop
@pytest.mark.slow
def test_plain_simclr_comparison_keys(result: dict[str, Any]) -> None:
    """Our step against the plain loop at the run's precision (auto: on a CPU with native bf16 the
    same arms as the bf16 row, on another CPU the fp32 row's), at fp32, and at bf16 + channels-last
    exactly where this CPU computes bf16 natively."""
    from bayesncl.core.optim import native_cpu_bf16

    speed, rates = result["speedup_vs_plain_simclr"], result["images_per_s_by_precision"]
    assert set(speed) == set(rates) == {"default", "fp32"} | ({"bf16"} if native_cpu_bf16() else set())
    for label, by in speed.items():
        assert set(by) == set(rates[label]) == {"cl", "ncl", "bayesncl"}
        assert all(math.isfinite(v) and v > 0 for v in [*by.values(), *rates[label].values()])
    same = "bf16" if native_cpu_bf16() else "fp32"
    assert speed["default"] == speed[same] and rates["default"] == rates[same] == result["images_per_s"]
    plain = result["plain_simclr"]
    assert set(plain["images_per_s_by_workers"]) == {"0", "1", "2"} and plain["workers"] in (0, 1, 2)
    assert plain["images_per_s"] == max(plain["images_per_s_by_workers"].values()) > 0


def test_plain_nt_xent_is_our_info_nce() -> None:
    """The plain loop's loss, written as the examples write it, against our InfoNCE and a naive
    per-row loop: same value and same gradient."""
    import torch

    from bayesncl.core.losses import info_nce
    from bayesncl.paper.plain_simclr import nt_xent

    g = torch.Generator().manual_seed(0)
    z0, z1 = torch.randn(5, 7, generator=g, requires_grad=True), torch.randn(5, 7, generator=g)
    plain = nt_xent(z0, z1, 0.2)
    ours = info_nce(torch.cat([z0, z1]), 0.2)
    z = torch.nn.functional.normalize(torch.cat([z0, z1]), dim=1).detach()
    naive = 0.0
    for i in range(10):
        others = [j for j in range(10) if j != i]
        s = torch.stack([z[i] @ z[j] / 0.2 for j in others])
        naive += float(torch.logsumexp(s, 0) - z[i] @ z[(i + 5) % 10] / 0.2) / 10
    assert plain.item() == pytest.approx(ours.item(), abs=1e-6)
    assert plain.item() == pytest.approx(naive, abs=1e-5)
    (g_plain,) = torch.autograd.grad(plain, z0)
    (g_ours,) = torch.autograd.grad(info_nce(torch.cat([z0, z1]), 0.2), z0)
    assert torch.allclose(g_plain, g_ours, atol=1e-6)


def test_plain_pairs_are_two_normalised_views() -> None:
    import torch

    from bayesncl.paper.plain_simclr import PlainPairs, plain_transform

    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    v1, v2 = PlainPairs(images, plain_transform(16, (0.5,) * 3, (0.25,) * 3))[2]
    assert v1.shape == v2.shape == (3, 16, 16) and v1.dtype == torch.float32
    assert not torch.equal(v1, v2) and float(v1.min()) >= -2.0 - 1e-6 and float(v1.max()) <= 2.0 + 1e-6
    gray = PlainPairs(images[:, :1], plain_transform(16, (0.5,), (0.25,)))[0][0]
    assert gray.shape == (1, 16, 16)


@pytest.mark.parametrize(
    ("argv", "message", "found_by_the_data"),
    [
        (["--device", "cuda"], "no CUDA device is available", False),
        (["--batch-size", "6000"], "batch_size=6000 is larger than the 5000 training samples", True),
        (["--steps", "0"], "--steps=0: expected >= 1", False),
        (["model.bogus=1"], "unknown config key 'model.bogus'", False),
        (["model.proj_dim=0"], "model.proj_dim=0: expected >= 1", False),
    ],
)
def test_bad_input_is_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str, found_by_the_data: bool
) -> None:
    """One line on stderr; a bad setting is refused before the first progress line, a batch too large
    for the data once the data is built (after "... building 3 models")."""
    import torch

    if argv[:2] == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    base = [a for a in TINY if a not in ("--device", "cpu")] if argv[0] == "--device" else TINY
    assert main([*base, *argv]) == 2
    out, err = capsys.readouterr()
    assert err.strip().startswith("bayesncl: error:") and "\n" not in err.strip() and message in err
    assert (out == "") != found_by_the_data, out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--device", "tpu"], "benchmark --device='tpu': expected auto, cpu, cuda or cuda:N"),
        (["--device", "cuda:x"], "benchmark --device='cuda:x': expected auto, cpu, cuda or cuda:N"),
        (["--threads", "-3"], "benchmark --threads=-3: expected >= 0"),
        (["--batch-size", "1"], "benchmark --batch-size=1: expected >= 2"),
        (
            ["method.name=cl"],
            "method.name defines the benchmark's arms (cl, ncl, bayesncl on the synthetic set, resident "
            "and per-sample data paths); it cannot be overridden here",
        ),
        (
            ["data.resident=false", "data.name=cifar10"],
            "data.name, data.resident define the benchmark's arms (cl, ncl, bayesncl on the synthetic "
            "set, resident and per-sample data paths); they cannot be overridden here",
        ),
        (
            ["data.image_size=64"],
            "data.image_size is set by benchmark --image-size; pass that option instead",
        ),
    ],
)
def test_bad_settings_are_refused_in_one_exact_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """Refused before any model is built: a wrong device or thread count, or an override of what
    the benchmark sets itself (the arms' method.name, the data paths, the keys its options set)."""
    base = [a for a in TINY if a not in ("--device", "cpu")] if argv[0] == "--device" else TINY
    assert main([*base, *argv]) == 2
    assert capsys.readouterr().err == f"bayesncl: error: {message}\n"


def test_the_cli_registers_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    from bayesncl.app.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if "benchmark" not in sub.choices:
        pytest.skip("cli.py does not register `benchmark` yet (docs/scaling.md gives the two lines)")
    with pytest.raises(SystemExit):
        parser.parse_args(["benchmark", "--help"])
    assert "--json" in capsys.readouterr().out


def test_no_arm_keeps_one_predecessor_over_the_rounds() -> None:
    """Issue 46: a rotation by one per round gave every arm the same predecessor in every round (CL always
    after the plain loop's DataLoader workers). The seeded shuffle gives CL several predecessors over 3
    rounds, the same orders on every run, and every arm once per round."""
    from bayesncl.paper.benchmark import _Arm, round_order

    arms = [_Arm(name, lambda: None, 1, 1) for name in ("cl", "ncl", "bayesncl", "a", "b", "plain/w2")]
    orders = [[a.name for a in round_order(arms, r)] for r in range(3)]
    assert all(sorted(o) == sorted(a.name for a in arms) for o in orders)
    before = {o[o.index("cl") - 1] if o.index("cl") else "(first)" for o in orders}
    assert len(before) >= 2, orders
    assert orders == [[a.name for a in round_order(arms, r)] for r in range(3)]
    rotated = [[a.name for a in arms[r:] + arms[:r]] for r in range(3)]  # the old order: one predecessor
    assert len({o[o.index("cl") - 1] for o in rotated}) == 1
