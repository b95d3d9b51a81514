"""Issue 15: the shared-background benchmark, the background metrics, NCL-IPW, Waterbirds, the study."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bayesncl.app.cli import main
from bayesncl.config import ConfigError, build_config
from bayesncl.data import clear_cache
from bayesncl.data.backgrounds import PLACE_NAMES, composite, draw_places, places_of
from bayesncl.data.fmnist import DEBIAN_FMNIST
from bayesncl.data.sources import STATS, DataError, load_split

from ..conftest import (
    ERROR,
    TINY,
    TINY_BASE,
    error_line,
    expect,
    fmnist_folder,
    resumable_checkpoint,
    tiny_checkpoint,
)


# ----------------------------------------------------------------------------- tiny data on disk
@pytest.fixture()
def fm_root(tmp_path: Path):
    clear_cache()
    yield fmnist_folder(tmp_path / "fm")
    clear_cache()


def bg_cfg(root: Path, *extra: str):
    return build_config(overrides=["data.name=fashion-mnist-bg", f"data.root={root}", *extra]).data


# ----------------------------------------------------------------------------- fashion-mnist-bg
def test_composite_uses_the_gray_level_as_alpha():
    g = np.zeros((1, 28, 28), dtype=np.uint8)
    g[0, 0, 0], g[0, 0, 1] = 255, 51  # alpha 1 and 0.2
    bg = np.full((1, 3, 32, 32), 0.5, dtype=np.float32)
    out = composite(g, bg)
    assert out.shape == (1, 3, 32, 32) and out.dtype == np.uint8
    assert out[0, :, 2, 2].tolist() == [255] * 3  # the garment sits at (2, 2): padding (32 - 28) / 2
    assert out[0, :, 2, 3].tolist() == [round((0.2 + 0.8 * 0.5) * 255)] * 3  # 153
    assert out[0, :, 0, 0].tolist() == [128] * 3  # background only: round(0.5 * 255)


def test_draw_places_follows_the_class_with_probability_p():
    rng = lambda: np.random.default_rng(3)  # noqa: E731
    y = np.arange(20000) % 10
    free, half, full = draw_places(y, 0.0, rng()), draw_places(y, 0.5, rng()), draw_places(y, 1.0, rng())
    assert np.array_equal(full, y)
    assert abs((free == y).mean() - 0.1) < 0.01
    assert abs((half == y).mean() - (0.5 + 0.5 * 0.1)) < 0.015  # p + (1 - p) / 10
    moved = half != y
    assert np.array_equal(half[moved], free[moved])  # rows that do not follow keep their uniform place


def test_fashion_mnist_bg_split_places_and_spurious_train_only(fm_root: Path):
    data = load_split(bg_cfg(fm_root), "train")
    assert data.images.shape == (200, 3, 32, 32) and data.images.dtype == torch.uint8
    assert data.places.shape == (200,) and set(data.places) <= set(range(len(PLACE_NAMES)))
    again = load_split(bg_cfg(fm_root), "train")
    assert torch.equal(data.images, again.images)
    clear_cache()
    assert torch.equal(load_split(bg_cfg(fm_root), "train").images, data.images)  # same from the seed
    spur_train = load_split(bg_cfg(fm_root, "data.bg_correlation=1"), "train")
    assert np.array_equal(spur_train.places, spur_train.labels)
    spur_test = load_split(bg_cfg(fm_root, "data.bg_correlation=1"), "test")
    assert np.array_equal(
        spur_test.places, load_split(bg_cfg(fm_root), "test").places
    )  # test stays independent
    sub = bg_cfg(fm_root, "data.train_subset=50")
    idx = load_split(sub, "train")
    assert len(idx) == 50 and np.array_equal(places_of(sub, "train"), idx.places)
    # the garment sits on its background: the border pixels are the background's
    assert not torch.equal(data.images[:, :, 0, 0], torch.zeros_like(data.images[:, :, 0, 0]))


@pytest.mark.skipif(not DEBIAN_FMNIST.is_dir(), reason="needs the dataset-fashion-mnist package")
def test_fashion_mnist_bg_statistics_match_the_data():
    clear_cache()
    x = load_split(build_config(overrides=["data.name=fashion-mnist-bg"]).data, "train").images
    mean = x.float().div(255).mean((0, 2, 3))
    std = x.float().div(255).std((0, 2, 3))
    assert np.allclose(mean.numpy(), STATS["fashion-mnist-bg"][0], atol=1e-3)
    assert np.allclose(std.numpy(), STATS["fashion-mnist-bg"][1], atol=1e-3)
    clear_cache()


@pytest.mark.parametrize(
    ("row", "overrides"),
    [
        ("W1", ["data.name=fashion-mnist-bg", "data.bg_correlation=1.5"]),
        ("W1", ["data.name=fashion-mnist-bg", "data.bg_correlation=-0.1"]),
        ("W2", ["data.name=synthetic", "data.bg_correlation=0.5"]),
        ("W3", ["method.name=ncl-ipw", "method.gate=ste"]),
        ("W4", ["method.name=ncl-ipw", "method.ipw_momentum=1"]),
    ],
)
def test_bg_correlation_and_ipw_bad_config(tmp_path: Path, capsys, row: str, overrides: list[str]):
    with pytest.raises(ConfigError) as e:
        build_config(overrides=overrides)
    expect(row, ERROR + str(e.value), tmp_path)
    assert row != "W1" or str(e.value).startswith(overrides[-1] + ":")  # W1's … is the value given
    assert main(["pretrain", "--run-dir", str(tmp_path / "r"), *TINY, *overrides]) == 2  # the same line
    assert error_line(capsys) == ERROR + str(e.value)
    assert not (tmp_path / "r").exists()


def test_ncl_ipw_sets_no_gate_and_no_kl():
    cfg = build_config(overrides=["method.name=ncl-ipw"])
    assert cfg.method.ipw and cfg.method.gate == "none" and cfg.method.lam == 0.0


def test_bad_config_is_one_line(capsys):
    assert main(["pretrain", *TINY, "method.name=ncl-ipw", "method.gate=gumbel"]) == 2
    assert "method.gate=gumbel" in error_line(capsys)


# ----------------------------------------------------------------------------- NCL-IPW
def _hand_ipw_loss(z: np.ndarray, pi: np.ndarray, t: float) -> float:
    """Definition 4.4 literally: s(a, b) = Σ_k a_k b_k / π_k, cosine-normalised, NT-Xent."""
    n2 = len(z)

    def s(a, b):
        return float(sum(a[k] * b[k] / pi[k] for k in range(len(pi))))

    total = 0.0
    for i in range(n2):
        pos = (i + n2 // 2) % n2
        sims = {j: s(z[i], z[j]) / np.sqrt(s(z[i], z[i]) * s(z[j], z[j])) / t for j in range(n2) if j != i}
        total += -(sims[pos] - np.log(sum(np.exp(v) for v in sims.values())))
    return total / n2


def test_ipw_loss_equals_the_hand_computation_with_pi_fixed():
    from bayesncl.core.losses import ipw_info_nce

    z = np.array([[1.0, 0.0, 2.0], [0.5, 1.0, 0.0], [1.0, 0.2, 1.5], [0.0, 1.0, 0.3]])
    pi = np.array([0.9, 0.1, 0.4])
    w = torch.tensor(pi, dtype=torch.float32).rsqrt()
    got = float(ipw_info_nce(torch.tensor(z, dtype=torch.float32), w, 0.5))
    assert got == pytest.approx(_hand_ipw_loss(z, pi, 0.5), rel=1e-5)


def test_uniform_pi_is_ncl_exactly():
    from bayesncl.core.losses import info_nce, ipw_info_nce
    from bayesncl.core.parts import safe_normalize

    z = torch.rand(8, 5)
    ncl = info_nce(safe_normalize(z), 0.2)
    assert torch.equal(ipw_info_nce(z, torch.ones(5), 0.2), ncl)
    assert torch.equal(ipw_info_nce(z, torch.full((5,), 2.0), 0.2), ncl)  # a power of two: exact too
    assert float(ipw_info_nce(z, torch.full((5,), 1.7), 0.2)) == pytest.approx(float(ncl), rel=1e-6)


def test_model_with_uniform_pi_gives_ncl_loss_and_gradient():
    from bayesncl.core.model import build_model, contrastive_loss

    base = [*TINY_BASE, "train.epochs=1"]
    ncl_cfg = build_config(overrides=[*base, "method.name=ncl"])
    ipw_cfg = build_config(overrides=[*base, "method.name=ncl-ipw"])
    torch.manual_seed(0)
    ncl = build_model(ncl_cfg, 3, 16, 10).eval()
    ipw = build_model(ipw_cfg, 3, 16, 10).eval()
    ipw.load_state_dict({**ncl.state_dict(), "prevalence.pi": torch.ones(16)})
    x = torch.randn(8, 3, 16, 16)
    losses = []
    for model, cfg in ((ncl, ncl_cfg), (ipw, ipw_cfg)):
        model.zero_grad()
        loss, _ = contrastive_loss(model(x), cfg.method)
        loss.backward()
        losses.append((loss.detach(), model.projector.net[0].weight.grad.clone()))
    assert torch.equal(losses[0][0], losses[1][0]) and torch.equal(losses[0][1], losses[1][1])


def test_prevalence_ema_update_and_no_gradient():
    from bayesncl.core.losses import ipw_info_nce
    from bayesncl.core.parts import Prevalence

    p = Prevalence(3, momentum=0.9, eps=0.05)
    z = torch.tensor([[1.0, 0.0, 0.0], [2.0, 0.0, 3.0], [0.5, 0.0, 0.0], [1.0, 0.0, 0.0]])  # freq 1, 0, 1/4
    p.update(z)
    assert torch.allclose(p.pi, torch.tensor([1.0, 0.9, 0.9 + 0.1 * 0.25]))
    p.update(z)
    assert torch.allclose(p.pi, torch.tensor([1.0, 0.81, 0.9 * 0.925 + 0.025]))
    p.pi.fill_(0.01)  # below the floor: weights use eps
    assert torch.allclose(p.weights(), torch.full((3,), 0.05**-0.5))
    assert "pi" in dict(p.named_buffers()) and not p.pi.requires_grad
    w = p.weights().clone().requires_grad_(True)
    zz = torch.rand(4, 3, requires_grad=True)
    ipw_info_nce(zz, w).backward()
    assert w.grad is None and zz.grad is not None and p.pi.grad is None


def test_prevalence_updates_in_training_only_and_is_checkpointed(tmp_path: Path):
    from bayesncl.core.model import build_model

    cfg = build_config(overrides=[*TINY, "method.name=ncl-ipw", "method.ipw_momentum=0.5"])
    model = build_model(cfg, 3, 16, 10)
    x = torch.randn(8, 3, 16, 16)
    model.eval()
    model(x)
    assert torch.equal(model.prevalence.pi, torch.ones(16))  # eval: no update
    model.train()
    out = model(x)
    freq = (out.z > 0).float().mean(0)
    assert torch.allclose(model.prevalence.pi, 0.5 + 0.5 * freq)
    assert torch.allclose(out.ipw_weights, (0.5 + 0.5 * freq).clamp_min(0.01).rsqrt())
    # z̃ (the evaluation features) stays NCL's normalize(z), unweighted
    assert torch.allclose(out.z_tilde, torch.nn.functional.normalize(out.z, dim=1))
    assert "prevalence.pi" in model.state_dict()


@pytest.mark.slow
def test_ncl_ipw_resume_is_exact(tmp_path: Path):
    args = [*TINY_BASE, "method.name=ncl-ipw", "train.epochs=2", "--no-eval"]
    straight, resumed = tmp_path / "a", tmp_path / "b"
    assert main(["pretrain", "--run-dir", str(straight), *args]) == 0
    assert (
        main(
            [
                "pretrain",
                "--run-dir",
                str(resumed),
                *[a for a in args if a != "train.epochs=2"],
                "train.epochs=1",
            ]
        )
        == 0
    )
    assert main(["pretrain", "--run-dir", str(resumed), "--resume", *args]) == 0
    a = torch.load(straight / "last.pt", weights_only=True)["state_dict"]
    b = torch.load(resumed / "last.pt", weights_only=True)["state_dict"]
    assert not torch.equal(a["prevalence.pi"], torch.ones_like(a["prevalence.pi"]))
    assert all(torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- background metrics
def _design():
    """4 classes x 4 places, every pair 5 times; dims: object, background, constant, both, dead x2."""
    y = np.repeat(np.arange(4), 20)
    g = np.tile(np.repeat(np.arange(4), 5), 4)
    f = np.zeros((80, 6))
    f[:, 0] = y == 0
    f[:, 1] = 2.0 * (g == 2)
    f[:, 2] = 1.0
    f[:, 3] = (y == 1).astype(float) + (g == 1)
    return f, y, g


def test_group_lift_and_kinds_by_hand():
    from bayesncl.metrics.background import dimension_kinds, group_lift

    f, y, g = _design()
    ft = torch.tensor(f)
    rc, rp = group_lift(ft, torch.tensor(y)), group_lift(ft, torch.tensor(g))
    # dim 3: class 1 mean 1.25, others 0.25 -> kappa 0.625, lift (0.625 - 1/4) / (3/4) = 0.5
    assert np.allclose(rc[:4], [1.0, 0.0, 0.0, 0.5]) and np.allclose(rp[:4], [0.0, 1.0, 0.0, 0.5])
    assert np.isnan(rc[4:]).all()
    assert dimension_kinds(f, y, g).tolist() == [0, 1, 2, 2, -1, -1]


def test_background_metrics_by_hand():
    from bayesncl.metrics.background import background_metrics

    f, y, g = _design()
    mask = np.ones_like(f)
    mask[:, 1] = 0  # the background dim: closed everywhere
    mask[np.flatnonzero(y == 0)[:10], 0] = 0  # the object dim: half of its 20 firing entries
    m = background_metrics(f, y, g, z=f, mask=mask)
    assert m["background_dims_fraction"] == 0.25 and m["object_dims_fraction"] == 0.25
    assert m["background_mass_fraction"] == pytest.approx(40 / 180)  # dims' masses 20, 40, 80, 40
    assert m["class_lift_mean"] == pytest.approx(1.5 / 4) and m["place_lift_mean"] == pytest.approx(1.5 / 4)
    assert m["gate_closure_background"] == 1.0 and m["gate_closure_object"] == 0.5
    ungated = background_metrics(f, y, g)
    assert ungated["gate_closure_background"] is None and ungated["gate_closure_object"] is None


def test_metrics_command_on_a_file_with_places(tmp_path: Path, capsys):
    from bayesncl.runs.features import load_features, save_features

    rng = np.random.default_rng(0)
    g = np.arange(200) % 4
    y = rng.integers(0, 5, 200)
    h = np.eye(4)[g] + 0.05 * rng.standard_normal((200, 4))
    f, _, _ = _design()
    feats = np.abs(rng.standard_normal((200, 6)))
    save_features(tmp_path / "f.npz", features=feats, labels=y, places=g, h=h)
    assert np.array_equal(load_features(tmp_path / "f.npz").places, g)
    assert main(["metrics", str(tmp_path / "f.npz"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["background_probe_acc1"] == 100.0 and "stratified halves" in out["background_probe_protocol"]
    assert 0 <= out["background_dims_fraction"] <= 1 and out["gate_closure_background"] is None


# ----------------------------------------------------------------------------- extract, evaluate
@pytest.mark.slow
def test_extract_and_evaluate_carry_places(tmp_path: Path, fm_root: Path):
    data = [
        "data.name=fashion-mnist-bg",
        f"data.root={fm_root}",
        "data.train_subset=96",
        "data.test_subset=60",
    ]
    ckpt = tiny_checkpoint(tmp_path / "m.pt", [*data, "method.name=bayesncl"])
    out = tmp_path / "f.npz"
    assert main(["extract", str(ckpt), "--out", str(out)]) == 0
    with np.load(out) as z:
        places, idx = z["places"], z["indices"]
        meta = json.loads(str(z["meta"]))
    cfg = build_config(overrides=[*TINY_BASE, *data]).data
    assert np.array_equal(places, places_of(cfg, "test")[idx]) and meta["place_names"] == list(PLACE_NAMES)
    assert main(["evaluate", str(ckpt), "--no-knn", "--probe", "fast"]) == 0
    ev = json.loads((tmp_path / "evaluation.json").read_text())
    assert 0 <= ev["background_probe_acc1"] <= 100 and "train -> test" in ev["background_probe_protocol"]
    assert ev["gate_closure_background"] is None or 0 <= ev["gate_closure_background"] <= 1


# ----------------------------------------------------------------------------- waterbirds
def waterbirds_folder(
    root: Path, per_split: int = 12, columns=("img_filename", "y", "split", "place")
) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    rows = []
    for split in (0, 1, 2):
        for i in range(per_split):
            name = f"{split:03d}.bird/img_{i}.jpg"
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            place = i % 2
            img = np.zeros((20, 20, 3), dtype=np.uint8)
            img[..., 2 if place else 1] = 200  # water blue, land green
            img[8:12, 8:12] = rng.integers(0, 255, (4, 4, 3))
            Image.fromarray(img).save(root / name)
            rows.append({"img_filename": name, "y": (i // 2) % 2, "split": split, "place": place})
    with (root / "metadata.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return root


def test_waterbirds_reader(tmp_path: Path):
    clear_cache()
    root = waterbirds_folder(tmp_path / "wb")
    cfg = build_config(overrides=["data.name=waterbirds", f"data.root={root}"]).data
    train, test = load_split(cfg, "train"), load_split(cfg, "test")
    assert len(train) == 12 and all("/000.bird/" in p for p in train.paths)
    assert all("/002.bird/" in p for p in test.paths)
    assert train.places.tolist() == [i % 2 for i in range(12)] and train.labels.tolist() == [
        (i // 2) % 2 for i in range(12)
    ]
    assert train.class_names == ("landbird", "waterbird")
    clear_cache()


@pytest.mark.parametrize(("damage", "row"), [("no-csv", "W5"), ("no-column", "W6"), ("no-file", "W7")])
def test_waterbirds_bad_folder_is_one_line(tmp_path: Path, capsys, damage: str, row: str):
    clear_cache()
    root = tmp_path / "wb"
    columns = (
        ("img_filename", "y", "split") if damage == "no-column" else ("img_filename", "y", "split", "place")
    )
    waterbirds_folder(root, columns=columns)
    if damage == "no-csv":
        (root / "metadata.csv").unlink()
    if damage == "no-file":
        (root / "000.bird" / "img_3.jpg").unlink()
    with pytest.raises(DataError) as e:
        load_split(build_config(overrides=["data.name=waterbirds", f"data.root={root}"]).data, "train")
    expect(row, ERROR + str(e.value), tmp_path)
    ckpt = tiny_checkpoint(tmp_path / "m.pt", [])
    assert (
        main(["extract", str(ckpt), "data.name=waterbirds", f"data.root={root}", "data.image_size=16"]) == 2
    )
    expect(row, error_line(capsys), tmp_path)
    clear_cache()


def test_waterbirds_names_what_is_wrong(tmp_path: Path):
    """Several absent images: the count and the first three; a bad value: its line; no folder."""
    root = tmp_path / "wb"
    waterbirds_folder(root)
    cfg = build_config(overrides=["data.name=waterbirds", f"data.root={root}"]).data
    clear_cache()
    with pytest.raises(DataError, match="^Waterbirds folder .*/nowhere \\(data.root\\) does not exist"):
        nowhere = build_config(overrides=["data.name=waterbirds", f"data.root={tmp_path}/nowhere"])
        load_split(nowhere.data, "train")
    images = sorted(root.rglob("*.jpg"))
    for f in images:
        f.unlink()
    clear_cache()
    with pytest.raises(DataError) as e:
        load_split(cfg, "train")
    n = int(str(e.value).split()[0])
    assert n > 3 and str(e.value).endswith(f" and {n - 3} more")
    assert str(e.value).count(f"{root}/") == 3
    meta = root / "metadata.csv"
    lines = meta.read_text().splitlines()
    meta.write_text("\n".join([lines[0], lines[1].rsplit(",", 1)[0] + ",sky", *lines[2:]]) + "\n")
    clear_cache()
    bad = "metadata.csv line 2: y, split and place must be integers, got .*place='sky'"
    with pytest.raises(DataError, match=bad):
        load_split(cfg, "train")
    clear_cache()


def test_table6_probes_each_encoder_on_waterbirds(tmp_path: Path, capsys):
    from bayesncl.paper.mechanism import table6

    clear_cache()
    root = waterbirds_folder(tmp_path / "wb")
    a = tiny_checkpoint(tmp_path / "ncl.pt", ["method.name=ncl"])
    b = tiny_checkpoint(tmp_path / "bayes.pt", ["method.name=bayesncl"])
    rows = table6(
        [str(a), str(b)], "waterbirds", tmp_path / "t6", [f"data.root={root}", "data.image_size=16"]
    )
    assert list(rows) == ["ncl", "bayesncl"]
    assert all(0 <= r["background_probe_acc1"] <= 100 for r in rows.values())
    assert rows["ncl"]["paper bg probe %"] == 93.33
    assert "bg probe %" in (tmp_path / "t6" / "table6.md").read_text()
    assert "warning" not in capsys.readouterr().out and not (tmp_path / "t6" / "report").exists()
    with pytest.raises(ConfigError, match="table 6 needs places"):
        table6([str(a)], "synthetic", None, [])
    clear_cache()


# ----------------------------------------------------------------------------- the study
def test_mechanism_configs_and_aggregate():
    from bayesncl.paper.mechanism import _shown as mech_shown
    from bayesncl.paper.mechanism import aggregate, mechanism_configs

    cfgs = mechanism_configs("fashion-mnist-bg", 2, ["train.epochs=1"])
    assert len(cfgs) == 4 * 2 * 2
    c = cfgs["NCL-IPW | p=0.9 | seed=1"]
    assert (c.method.name, c.data.bg_correlation, c.seed, c.train.epochs) == ("ncl-ipw", 0.9, 1, 1)
    with pytest.raises(ConfigError, match="runs on fashion-mnist-bg"):
        mechanism_configs("cifar10", 1, [])
    with pytest.raises(ConfigError, match="method.name defines the runs of the study"):
        mechanism_configs("fashion-mnist-bg", 1, ["method.name=cl"])
    means = aggregate({
        "NCL | p=0 | seed=0": {"semantic_consistency": 10.0, "AF-GV": 0.2, "gate_closure_background": None},
        "NCL | p=0 | seed=1": {"semantic_consistency": 20.0, "AF-GV": float("nan")},
    })  # fmt: skip
    row = means["NCL | p=0"]
    assert (
        row["seeds"] == 2 and row["semantic_consistency"] == 15.0
        and row["semantic_consistency_std"] == pytest.approx(50**0.5)  # ddof 1: sqrt((5^2 + 5^2) / 1)
    )
    assert mech_shown(means)["NCL, p=0"]["semantic_consistency"] == "15.00 ± 7.07"
    assert row["AF-GV"] == 0.2 and row["gate_closure_background"] is None


@pytest.mark.slow
def test_mechanism_study_end_to_end(tmp_path: Path, fm_root: Path, monkeypatch):
    from bayesncl.paper import mechanism as mech

    monkeypatch.setattr(mech, "MECHANISM_METHODS", (("BayesNCL (STE)", "bayesncl"),))
    tiny = [o for o in TINY if not o.startswith("data.name")] + [
        f"data.root={fm_root}",
        "model.cifar_stem=auto",
    ]
    means = mech.mechanism("fashion-mnist-bg", tmp_path / "study", tiny, seeds=1, samples=64)
    assert list(means) == ["BayesNCL (STE) | p=0", "BayesNCL (STE) | p=0.9"]
    for row in means.values():
        assert 0 <= row["background_probe_acc1"] <= 100 and row["seeds"] == 1
        assert row["AF-GV"] is None or -1 <= row["AF-GV"] <= 1
    saved = json.loads((tmp_path / "study" / "mechanism.json").read_text())
    assert set(saved) == {"means", "runs"} and len(saved["runs"]) == 2
    again = mech.mechanism("fashion-mnist-bg", tmp_path / "study", tiny, seeds=1, samples=64)  # reused
    assert again == json.loads(json.dumps(means))
    # --store: its runs are the store's STORE/<hash> (those of every table), linked from the run dir
    import shutil

    from bayesncl.paper import variants

    store, table = tmp_path / "store", tmp_path / "table"
    cfgs = mech.mechanism_configs("fashion-mnist-bg", 1, tiny)
    for name, cfg in cfgs.items():
        shutil.copytree(tmp_path / "study" / variants.slug(name), store / variants.variant_hash(cfg))
    monkeypatch.setattr("bayesncl.app.train.pretrain", lambda *a, **k: pytest.fail("trained"))
    assert mech.mechanism("fashion-mnist-bg", table, tiny, seeds=1, samples=64, store=store) == again
    assert sorted((table / variants.slug(n)).resolve() for n in cfgs) == sorted(store.iterdir())
    # its report names the runs as the table's folder does (it showed the store's hashes), and says
    # what the page is: the study, its header, a link to the table
    index = (table / "report" / "index.html").read_text()
    assert "<h1>bayesncl report: mechanism</h1>" in index and 'The table: <a href="../mechanism.md">' in index
    assert all(f'href="#run-{variants.slug(n)}"' in index for n in cfgs)
    assert not any(h.name in index for h in store.iterdir())
    # a packed run (small files only) of a table is left out of its page, and the page says so
    packed = tmp_path / "packed" / "bayesncl-ste-p-0-seed-0"
    packed.mkdir(parents=True)
    for f in ("config.yaml", "log.csv", "metrics.json"):
        shutil.copy(table / variants.slug(next(iter(cfgs))) / f, packed / f)
    shown = table / variants.slug(list(cfgs)[1])
    variants.write_report([packed, shown], tmp_path / "page", None, heading="x", intro="Runs.",
                          table="../x.md")
    index = (tmp_path / "page" / "index.html").read_text()
    left = "Runs. Left out of this page: 1 packed run(s) of the table (bayesncl-ste-p-0-seed-0). The table: "
    assert left in index
    assert f'href="#run-{shown.name}"' in index and 'href="#run-bayesncl-ste-p-0-seed-0"' not in index


BG_TINY = [o for o in TINY if not o.startswith("data.name")]  # the study sets data.name


def _finished(sub: Path, cfg, metrics: dict | None = None) -> Path:
    """A finished run without training: its config.yaml and metrics.json (what reuse reads)."""
    from bayesncl.config import dump_yaml

    sub.mkdir(parents=True)
    (sub / "config.yaml").write_text(dump_yaml(cfg))
    (sub / "metrics.json").write_text(json.dumps(metrics or {"semantic_consistency": 50.0, "AF-GV": 0.1}))
    return sub


def test_mechanism_checks_every_folder_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """reproduce mechanism checks its run dir, store and every run as reproduce does (one shared
    variants.check_dirs), before a word on stdout: a stored run with other settings is refused up
    front, naming it and what differs (it was refused only once the runs before it had trained)."""
    import dataclasses
    import shutil

    from bayesncl.paper import mechanism as mech
    from bayesncl.paper import variants

    monkeypatch.setattr(mech, "MECHANISM_METHODS", (("BayesNCL (STE)", "bayesncl"),))
    monkeypatch.setattr("bayesncl.app.train.pretrain", lambda *a, **k: pytest.fail("trained"))
    store, table = tmp_path / "store", tmp_path / "table"
    study = ["reproduce", "mechanism", "--dataset", "fashion-mnist-bg", "--store", str(store)]
    cfgs = mech.mechanism_configs("fashion-mnist-bg", 1, BG_TINY)
    _, second = cfgs.values()  # p=0 is still to train (first), p=0.9 stored with another lambda
    edited = dataclasses.replace(second, method=dataclasses.replace(second.method, lam=0.5))
    stored = _finished(store / variants.variant_hash(second), edited)
    assert main([*study, "--run-dir", str(table), *BG_TINY]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    expect("P10", err, tmp_path)
    assert f"the stored run {stored} " in err and f"(method.lam: 0.5 -> {second.method.lam}; stored" in err
    assert not table.exists() and sorted(store.iterdir()) == [stored]
    # without --store, a finished run in the run dir with other settings: named as such
    _finished(table / variants.slug("BayesNCL (STE) | p=0.9 | seed=0"), edited)
    assert main([*study[:4], "--run-dir", str(table), *BG_TINY]) == 2
    assert error_line(capsys) == (
        f"{ERROR}BayesNCL (STE), p=0.9, seed=0: {table / 'bayesncl-ste-p-0-9-seed-0'} holds a finished run "
        f"with other settings (method.lam: 0.5 -> {second.method.lam}; run's -> now); move "
        f"{table / 'bayesncl-ste-p-0-9-seed-0'} away (its run is then trained again), or choose another "
        "--run-dir"
    )
    # finished runs without last.pt (small files, as a packed store restores them) whose dynamics are
    # not in their metrics: final_dynamics would load their weights, so all are named before any training
    first, _ = cfgs.values()
    shutil.rmtree(store)
    bare = [_finished(store / variants.variant_hash(c), c, {"semantic_consistency": 50.0})
            for c in (first, second)]  # fmt: skip
    fresh = tmp_path / "fresh"
    assert main([*study, "--run-dir", str(fresh), *BG_TINY]) == 2
    line = error_line(capsys)
    assert "the mechanism study measures its runs from their weights, but 2 finished run(s) have no " in line
    assert all(str(sub) in line for sub in bare) and "move them out of the store" in line
    # --list-weightless: those runs' hashes, one a line, nothing else (what long_queue.sh sets aside)
    assert main([*study, "--run-dir", str(fresh), *BG_TINY, "--list-weightless"]) == 0
    assert capsys.readouterr() == (f"{bare[0].name}\n{bare[1].name}\n", "")
    (bare[0] / "metrics.json").write_text(json.dumps({"semantic_consistency": 50.0, "AF-GV": 0.1}))
    assert main([*study, "--run-dir", str(fresh), *BG_TINY]) == 2
    line = error_line(capsys)
    assert str(bare[1]) in line and str(bare[0]) not in line and not fresh.exists()
    assert main([*study, "--run-dir", str(fresh), *BG_TINY, "--list-weightless"]) == 0
    assert capsys.readouterr() == (f"{bare[1].name}\n", "")  # its dynamics in its metrics: reused
    assert not fresh.exists() and sorted(p.name for p in bare[1].iterdir()) == ["config.yaml", "metrics.json"]
    (tmp_path / "a-file").write_text("x")  # G1, as for every table
    assert main([*study[:4], "--run-dir", str(tmp_path / "a-file"), *BG_TINY]) == 2
    expect("G1", error_line(capsys), tmp_path)


def test_mechanism_store_refuses_a_run_dir_with_runs_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--store over a run dir that holds real <run>/ folders (the study run there before --store): their
    links could not be made, and the table would sit beside runs it does not show; it went on silently.
    Refused up front in one line, nothing written; once they are moved away it links the stored runs."""
    from bayesncl.paper import mechanism as mech
    from bayesncl.paper import variants

    monkeypatch.setattr(mech, "MECHANISM_METHODS", (("BayesNCL (STE)", "bayesncl"),))
    monkeypatch.setattr("bayesncl.app.train.pretrain", lambda *a, **k: pytest.fail("trained"))
    monkeypatch.setattr(variants, "write_table", lambda *a, **k: None)  # (no report of fake runs)
    store, table = tmp_path / "store", tmp_path / "table"
    cfgs = mech.mechanism_configs("fashion-mnist-bg", 1, BG_TINY)
    for cfg in cfgs.values():
        _finished(store / variants.variant_hash(cfg), cfg)
    old = [_finished(table / variants.slug(n), c, {"old": 1.0}) for n, c in cfgs.items()]
    before = sorted(p.name for p in table.rglob("*"))
    study = ["reproduce", "mechanism", "--dataset", "fashion-mnist-bg", "--run-dir", str(table)]
    assert main([*study, "--store", str(store), *BG_TINY]) == 2
    expect("P11", error_line(capsys), tmp_path)
    assert sorted(p.name for p in table.rglob("*")) == before and not any(p.is_symlink() for p in old)
    for sub in old:
        sub.rename(tmp_path / sub.name)
    assert main([*study, "--store", str(store), *BG_TINY]) == 0
    assert sorted((table / variants.slug(n)).resolve() for n in cfgs) == sorted(store.iterdir())


@pytest.mark.slow
def test_reproduce_dispatches_table_6_and_the_mechanism_study(monkeypatch, capsys):
    import bayesncl.paper.mechanism as mech
    from bayesncl.app.cli import main

    calls = []
    monkeypatch.setattr(mech, "table6", lambda *a: calls.append(("6", a)))
    monkeypatch.setattr(mech, "mechanism", lambda *a, **k: calls.append(("mechanism", a, k)))
    assert main(["reproduce", "6", "--dataset", "waterbirds", "runA", "data.root=W", "ckpt.pt"]) == 0
    study = ["reproduce", "mechanism", "--dataset", "fashion-mnist-bg"]
    assert main([*study, "--seeds", "3", "train.epochs=1"]) == 0
    assert calls == [
        ("6", (["runA", "ckpt.pt"], "waterbirds", None, ["data.root=W"])),
        ("mechanism", ("fashion-mnist-bg", None, ["train.epochs=1"]), {"seeds": 3, "store": None}),
    ]
    assert main([*study, "--store", "S"]) == 0 and calls[-1][2] == {"seeds": 1, "store": Path("S")}
    assert main(["reproduce", "6", "--dataset", "waterbirds", "runA", "--store", "S"]) == 2
    assert error_line(capsys) == f"{ERROR}--store: table 6 trains no runs (it probes the encoders given)"
    assert main([*study, "--seeds", "0"]) == 2
    assert "--seeds 0: expected >= 1" in capsys.readouterr().err
    assert main(["reproduce", "nope", "--dataset", "fashion-mnist"]) == 2
    assert "6, mechanism" in capsys.readouterr().err


@pytest.mark.slow
def test_mechanism_checks_unfinished_runs_and_trains_over_a_run_without_a_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unfinished run (a last.pt) started with other settings is refused before any training, with
    advice for reproduce (it was refused when its turn came, with pretrain's --resume advice). A run cut
    short without a last.pt (config.yaml and log.csv, no metrics.json) is trained again, as the tables
    do (pretrain with overwrite); the study called pretrain without overwrite and failed there, after the
    runs before it had trained."""
    import dataclasses

    from bayesncl.config import dump_yaml
    from bayesncl.paper import mechanism as mech
    from bayesncl.paper import variants
    from bayesncl.runs.rundir import prepare_run_dir

    monkeypatch.setattr(mech, "MECHANISM_METHODS", (("BayesNCL (STE)", "bayesncl"),))
    monkeypatch.setattr(variants, "write_table", lambda *a, **k: None)  # (no report of fake runs)
    calls: list[tuple[str, bool, bool]] = []

    def pretrain(cfg, sub: Path, *, resume: bool = False, overwrite: bool = False) -> dict:
        prepare_run_dir(sub, cfg, resume=resume, overwrite=overwrite)  # pretrain's own check of its run dir
        calls.append((sub.name, resume, overwrite))
        sub.mkdir(parents=True, exist_ok=True)
        return {"semantic_consistency": 40.0 + len(calls), "AF-GV": 0.5}

    monkeypatch.setattr("bayesncl.app.train.pretrain", pretrain)
    table = tmp_path / "table"
    first, second = mech.mechanism_configs("fashion-mnist-bg", 1, BG_TINY).values()
    cut = table / "bayesncl-ste-p-0-seed-0"  # killed before its last.pt: config.yaml and log.csv
    cut.mkdir(parents=True)
    (cut / "config.yaml").write_text(dump_yaml(first))
    (cut / "log.csv").write_text("epoch,step\n")
    other = table / "bayesncl-ste-p-0-9-seed-0"  # unfinished, started with another lambda
    resumable_checkpoint(
        other / "last.pt", dataclasses.replace(second, method=dataclasses.replace(second.method, lam=0.5))
    )
    study = ["reproduce", "mechanism", "--dataset", "fashion-mnist-bg", "--run-dir", str(table)]
    assert main([*study, *BG_TINY]) == 2
    assert error_line(capsys, silent=True) == (
        f"{ERROR}BayesNCL (STE), p=0.9, seed=0: {other} holds an unfinished run (last.pt) started with "
        f"other settings (method.lam: 0.5 -> {second.method.lam}; run's -> now), which this command would "
        f"continue: move {other} away (its run is then trained from the start), or choose another --run-dir"
    )
    assert calls == []
    other.rename(tmp_path / "moved")
    assert main([*study, *BG_TINY]) == 0
    assert calls == [(cut.name, False, True), (other.name, False, False)]  # trained over it, and anew


def test_mechanism_offers_store_only_where_store_would_not_be_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finished run of the run dir with other settings: the advice offered "or pass --store DIR", which
    P11 then refused, as the run dir holds that very folder (and its siblings) where --store links its
    stored runs; the advice looped. It is offered only where the run's folders are links (left by an
    earlier --store), and then --store passes the check."""
    import dataclasses

    from bayesncl.paper import mechanism as mech
    from bayesncl.paper import variants

    monkeypatch.setattr(mech, "MECHANISM_METHODS", (("BayesNCL (STE)", "bayesncl"),))
    monkeypatch.setattr("bayesncl.app.train.pretrain", lambda *a, **k: pytest.fail("trained"))
    table = tmp_path / "table"
    cfgs = mech.mechanism_configs("fashion-mnist-bg", 1, BG_TINY)
    name = "BayesNCL (STE) | p=0.9 | seed=0"
    edited = dataclasses.replace(cfgs[name], method=dataclasses.replace(cfgs[name].method, lam=0.5))
    sub = _finished(table / variants.slug(name), edited)
    study = ["reproduce", "mechanism", "--dataset", "fashion-mnist-bg", "--run-dir", str(table), *BG_TINY]
    assert main(study) == 2
    err = error_line(capsys)
    assert err.endswith(f"move {sub} away (its run is then trained again), or choose another --run-dir")
    assert main([*study, "--store", str(tmp_path / "store")]) == 2  # what --store would have met
    assert f"run dir {table} holds folders of its own where the mechanism study links its stored runs " \
        "(bayesncl-ste-p-0-9-seed-0; from before --store?" in error_line(capsys)  # P11
    sub.rename(tmp_path / "elsewhere")  # a link where the folder was, as an earlier --store leaves
    sub.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert main(study) == 2
    assert error_line(capsys).endswith(
        f"move {sub} away (its run is then trained again), choose another --run-dir, or pass --store DIR"
    )
    links = tuple(variants.slug(n) for n in cfgs)
    assert variants.check_dirs(table, tmp_path / "store", "the mechanism study", {}, links=links) == {}


def test_mechanism_reuses_its_own_finished_runs_wherever_the_store_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --store, a finished run of the run dir that differs only in data.root,
    train.checkpoint_every or data.num_workers (keys a run's name leaves out: the store reuses it) was
    refused as "a finished run with other settings" (the run dir checked another, shorter set of keys).
    One set now: the study reuses it, as the store would."""
    import dataclasses

    from bayesncl.paper import mechanism as mech
    from bayesncl.paper import variants

    monkeypatch.setattr(mech, "MECHANISM_METHODS", (("BayesNCL (STE)", "bayesncl"),))
    monkeypatch.setattr("bayesncl.app.train.pretrain", lambda *a, **k: pytest.fail("trained"))
    monkeypatch.setattr(variants, "write_table", lambda *a, **k: None)  # (no report of fake runs)
    table = tmp_path / "table"
    for i, (name, cfg) in enumerate(mech.mechanism_configs("fashion-mnist-bg", 1, BG_TINY).items()):
        elsewhere = dataclasses.replace(
            cfg, data=dataclasses.replace(cfg.data, root=str(tmp_path / "old-root"), num_workers=2),
            train=dataclasses.replace(cfg.train, checkpoint_every=5),
        )
        assert variants.variant_hash(elsewhere) == variants.variant_hash(cfg)  # the store's same run
        _finished(table / variants.slug(name), elsewhere, {"semantic_consistency": 40.0 + i, "AF-GV": 0.1})
    means = mech.mechanism("fashion-mnist-bg", table, BG_TINY, seeds=1)
    assert [row["semantic_consistency"] for row in means.values()] == [40.0, 41.0]
    assert capsys.readouterr().out.count(": reusing ") == 2
    assert set(variants.IDENTITY_IGNORES) <= set(variants.REUSE_IGNORES)


@pytest.mark.slow
def test_mechanism_refuses_an_unfinished_run_beyond_its_train_epochs_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --store, an unfinished run of the run dir that began more epochs than the command's
    train.epochs passed the checks and failed at its turn, with pretrain's --resume advice. Refused up
    front with what fits reproduce; at train.epochs >= the epoch it stopped inside, it is continued. A
    finished run whose last.pt is gone, reused, is named where its dynamics need it."""
    from bayesncl.paper import mechanism as mech
    from bayesncl.paper import variants

    monkeypatch.setattr(mech, "MECHANISM_METHODS", (("BayesNCL (STE)", "bayesncl"),))
    monkeypatch.setattr(variants, "write_table", lambda *a, **k: None)  # (no report of fake runs)
    calls: list[tuple[str, bool]] = []

    def pretrain(cfg, sub: Path, *, resume: bool = False, overwrite: bool = False) -> dict:
        calls.append((sub.name, resume))
        return {"semantic_consistency": 40.0, "AF-GV": 0.5}

    monkeypatch.setattr("bayesncl.app.train.pretrain", pretrain)
    table = tmp_path / "table"
    study = ["reproduce", "mechanism", "--dataset", "fashion-mnist-bg", "--run-dir", str(table), *BG_TINY]
    first, second = mech.mechanism_configs("fashion-mnist-bg", 1, [*BG_TINY, "train.epochs=3"]).values()
    sub = table / "bayesncl-ste-p-0-9-seed-0"
    resumable_checkpoint(sub / "last.pt", second, epoch=2, partial=True)  # a 3-epoch run, stopped in epoch 3
    for epochs in (1, 2):
        assert main([*study, f"train.epochs={epochs}"]) == 2
        err = error_line(capsys, silent=True)
        assert err == (
            f"{ERROR}BayesNCL (STE), p=0.9, seed=0: {sub} holds an unfinished run (last.pt) that this "
            f"command would continue to train.epochs={epochs}, but the run stopped inside epoch 3: give "
            f"train.epochs >= 3, or move {sub} away (its run is then trained from the start), or choose "
            "another --run-dir"
        )
        if epochs == 1:
            expect("P20", err, tmp_path)
    assert calls == []
    done = _finished(table / "bayesncl-ste-p-0-seed-0", first)  # (reused: its metrics hold its dynamics)
    assert main([*study, "train.epochs=3"]) == 0
    assert calls == [(sub.name, True)]  # continued, and said so as the tables say it (not "pretraining into")
    assert f"== BayesNCL (STE) | p=0.9 | seed=0: continuing {sub}\n" in capsys.readouterr().out
    (done / "metrics.json").write_text('{"semantic_consistency": 40.0}')  # its dynamics: from its last.pt
    assert main([*study, "train.epochs=3"]) == 2
    assert error_line(capsys) == (  # named up front, before any training (as every table's)
        f"{ERROR}the mechanism study measures its runs from their weights, but 1 finished run(s) have no "
        f"last.pt (small files only, as a packed store restores them): BayesNCL (STE), p=0, seed=0 ({done}); "
        "move them away (their runs are then trained there), or choose another --run-dir"
    )
