"""Issue 26's protocol switches: the authors' bicubic crop (both executors, old hashes kept), their
``eval.use_soft_gating``, and the NCL studies' paper columns (no SEPIN one; fine-tuning's)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bayesncl.config import build_config
from bayesncl.core.model import build_model
from bayesncl.data.augment import AugmentSpec, BatchAugment, sample_transform
from bayesncl.paper import studies
from bayesncl.paper.variants import variant_hash

from ..conftest import TINY


def _spec(interpolation: str) -> AugmentSpec:  # the whole image, no other step: a plain resize 8 -> 16
    return AugmentSpec(16, 1, (0.0,), (1.0,), crop_min_scale=1.0, crop_ratio=(1.0, 1.0), jitter_p=0.0,
                       gray_p=0.0, blur_p=0.0, flip_p=0.0, interpolation=interpolation)  # fmt: skip


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_the_crop_resamples_as_asked_on_both_paths(mode: str) -> None:
    from PIL import Image

    torch.manual_seed(0)
    x = torch.rand(1, 1, 8, 8) * 0.5 + 0.25
    batched = BatchAugment(_spec(mode))(x)[0, 0]
    ref = F.interpolate(x, size=(16, 16), mode=mode, align_corners=True)[0, 0]  # kornia's corner-aligned warp
    inner = slice(3, -3)  # bicubic: kornia's warp pads with zeros, so the outer ring differs (documented)
    assert torch.allclose(batched[inner, inner], ref[inner, inner], atol=1e-5)
    assert float(batched.min()) >= 0.0 and float(batched.max()) <= 1.0
    image = Image.fromarray((x[0, 0] * 255).round().byte().numpy())
    per_sample = sample_transform(_spec(mode))(image)[0]
    pil = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}[mode]
    expected = torch.from_numpy(np.asarray(image.resize((16, 16), resample=pil))).float() / 255
    assert torch.allclose(per_sample, expected, atol=1e-6)


def test_bicubic_is_a_new_run_and_bilinear_keeps_the_old_hash() -> None:
    from bayesncl.data import build_train_loader
    from bayesncl.data.loaders import augment_spec

    cfg = build_config(overrides=TINY)
    same = build_config(overrides=[*TINY, "data.crop_interpolation=bilinear"])
    cubic = build_config(overrides=[*TINY, "data.crop_interpolation=bicubic"])
    assert variant_hash(cfg) == variant_hash(same) != variant_hash(cubic)
    assert augment_spec(cubic.data).interpolation == "bicubic"
    # the linear probe's and fine-tuning's crop stays bilinear, as the authors' classification loader
    probe = build_train_loader(cubic.data, 32, seed=0, device="cpu", crop_flip_only=True)
    assert probe.spec.interpolation == "bilinear"


def test_soft_gating_evaluates_with_alpha() -> None:
    """eval.use_soft_gating: z̃ = normalize(normalize(z) ⊙ α) (the authors' main_eval.py), by hand."""
    from bayesncl.app.evaluate import extract_split

    cfg = build_config(overrides=[*TINY, "method.name=bayesncl"])
    torch.manual_seed(0)
    model = build_model(cfg, 3, 16, 10).eval()
    x = torch.randn(6, 3, 16, 16)
    with torch.no_grad():
        hard = model(x)
        model.soft_eval_gate = True
        soft = model(x)
    model.soft_eval_gate = False
    unit = F.normalize(hard.z, dim=1)
    assert torch.allclose(soft.z_tilde, F.normalize(unit * hard.alpha, dim=1), atol=1e-6)
    assert torch.allclose(hard.z_tilde, F.normalize(unit * (hard.alpha > 0.5).float(), dim=1), atol=1e-6)
    assert torch.equal(soft.mask, hard.mask) and set(soft.mask.unique().tolist()) == {0.0, 1.0}
    on = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, use_soft_gating=True))
    feats = extract_split(model, on, "test", torch.device("cpu"))
    assert not model.soft_eval_gate  # restored after
    plain = extract_split(model, cfg, "test", torch.device("cpu"))
    assert np.array_equal(feats["mask"], (feats["alpha"] > 0.5).astype(np.float32))  # 0/1, not α
    assert np.array_equal(plain["mask"], feats["mask"])
    assert not np.allclose(plain["features"], feats["features"])  # the features alone are gated by α


def test_ncl_studies_paper_columns() -> None:
    sepin = studies.build("ncl-sepin", "imagenet100", [])
    # the paper's values sit beside SEPIN about x (its quantity), not beside the label-based SEPIN_y
    assert sepin.paper == {"CL": {"sepin_x@100": 0.69, "sepin_x@all": 0.47},
                           "NCL": {"sepin_x@100": 3.87, "sepin_x@all": 0.48}}  # fmt: skip
    assert [m for m, _ in sepin.measures] == ["sepin_x", "sepin"]
    assert studies.build("ncl-sepin", "fashion-mnist", []).paper == {}
    ft = studies.build("ncl-finetune", "imagenet100", [])
    assert ft.paper == {"CL": {"ft_acc1": 77.3}, "NCL": {"ft_acc1": 79.2}}
    assert ft.measures == [("finetune", ())]  # the authors' protocol as it is, on a GPU dataset
    cpu = studies.build("ncl-finetune", "fashion-mnist", [])
    assert cpu.measures == [("finetune", ("train.epochs=3", "train.warmup_epochs=1", "train.batch_size=256"))]


def test_ncl_fs_selection_probe_form() -> None:
    fast = studies.build("ncl-fs", "fashion-mnist", [])
    authors = studies.build("ncl-fs", "fashion-mnist", ["eval.selection_probe=authors"])
    assert fast.measures[0][0] == "selection" and authors.measures[0][0] == "selection_authors"
    assert fast.measures[0][1] == authors.measures[0][1]  # the same K grid, the same columns
    assert "the NCL authors' probe" in authors.notes[0] and "fast linear probe" in fast.notes[0]
    # an eval.* key: the same stored runs (variant names) under either form
    assert [v.name for v in fast.variants] == [v.name for v in authors.variants]


def test_selection_authors_and_sepin_x_measures_of_a_stored_run(tmp_path) -> None:
    from bayesncl.app.train import pretrain
    from bayesncl.paper import reproduce

    cfg = build_config(overrides=[*TINY, "method.name=ncl"])
    pretrain(cfg, tmp_path / "run", evaluate=False)
    out = reproduce.MEASURES["selection_authors"](tmp_path / "run", cfg, (4, 16))
    assert set(out) == {"K4.top_acc1", "K4.random_acc1", "K16.top_acc1", "K16.random_acc1"}
    assert all(0 <= v <= 100 for v in out.values())
    sep = reproduce.MEASURES["sepin_x"](tmp_path / "run", cfg, (50, 1, "all"))
    assert set(sep) == {"sepin_x@1", "sepin_x@all"} and sep["sepin_x@1"] >= 0 and sep["sepin_x@all"] >= 0


def test_fig4b_rho_panels_draw_every_cell_at_the_swept_lambda() -> None:
    # at the paper's λ = 3e-5 the ρ sweep (0.1-0.9) meets the λ lines at ρ = 0.8 (the paper's) and 0.3 (the
    # recipe's): the ρ panels draw all six cells in ρ order, each the same row (run) as in the λ panels
    built = studies.build("fig4b", "fashion-mnist-long", ["method.lam=3e-05"])
    rho_panels = [p for p in built.panels if p.xlabel == "ρ (prior)"]
    assert len(rho_panels) == 2
    for panel in rho_panels:
        (series,) = panel.series
        assert [x for x, _, _ in series.points] == [0.1, 0.3, 0.5, 0.7, 0.8, 0.9]
        assert dict((x, row) for x, row, _ in series.points)[0.8] == "rho=0.8 lambda=3e-05"
    lam_panels = [p for p in built.panels if p.xlabel == "λ (KL weight)"]
    lam_rows = {row for p in lam_panels for s in p.series for _, row, _ in s.points}
    assert "rho=0.8 lambda=3e-05" in lam_rows and len(built.rows) == 16
