"""Issue 13: the training step equals the authors' code (github Cui-Peng-624/BayesNCL @ 954d509).

One small, hand-checkable case per item of docs/paper-notes.md's fidelity table.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from PIL import Image, ImageFilter

from bayesncl.config import build_config
from bayesncl.core.engine import TrainForward
from bayesncl.core.losses import info_nce
from bayesncl.core.model import build_backbone, build_model
from bayesncl.core.optim import LrSchedule, build_optimizer, param_groups, peak_lrs
from bayesncl.core.parts import Gate, gumbel_noise
from bayesncl.data.augment import AugmentSpec, BatchAugment, sample_transform

from ..conftest import RECIPES


def _cfg(*overrides: str):
    return build_config(overrides=["model.backbone=small_cnn", "model.proj_hidden=16", "model.proj_dim=8",
                                   *overrides])


# ----------------------------------------------------------------------------- 1. BatchNorm per view
def test_per_view_batchnorm_equals_two_separate_forwards_in_train_mode() -> None:
    torch.manual_seed(0)
    model = build_model(_cfg(), 3, 16, 4).train()
    ref = copy.deepcopy(model)
    x1, x2 = torch.randn(5, 3, 16, 16), torch.randn(5, 3, 16, 16) + 1.0
    out, _ = TrainForward(model)(torch.cat([x1, x2]))  # what the training step runs
    h = torch.cat([ref.backbone(x1), ref.backbone(x2)])  # the authors: one forward per view
    torch.testing.assert_close(out.h, h, rtol=0, atol=1e-6)
    torch.testing.assert_close(out.z_tilde, ref.project(h).z_tilde, rtol=0, atol=1e-6)
    joint = build_model(_cfg("model.bn_views=joint"), 3, 16, 4).train()
    joint.load_state_dict(ref.state_dict())
    assert (joint(torch.cat([x1, x2]), views=2).h - h).abs().max() > 1e-2  # BN over 2n: other statistics
    model.eval()  # evaluation / extraction: one batch, running statistics, views play no part
    torch.testing.assert_close(model(x1, views=1).h, model(x1).h)


# ----------------------------------------------------------------------------- 2. CIFAR stem padding
@pytest.mark.parametrize("padding", [2, 1])
def test_cifar_stem_padding(padding: int) -> None:
    cfg = _cfg("model.backbone=resnet18", "model.cifar_stem=true", f"model.stem_padding={padding}")
    net, _ = build_backbone(cfg.model, 3, 32)
    assert net.conv1.padding == (padding, padding)
    assert net.conv1(torch.zeros(1, 3, 32, 32)).shape[-1] == 30 + 2 * padding  # 34 px with the authors' 2
    assert build_config().model.stem_padding == 2


# ----------------------------------------------------------------------------- 3, 4. parameter groups
def _lrs(recipe: str, *overrides: str, batch: int, world: int = 1) -> dict[str, float]:
    cfg = build_config(RECIPES / f"{recipe}.yaml", overrides=["model.proj_hidden=16", *overrides])
    model = build_model(cfg, 3, 32, 10)
    return {g["name"]: g["lr"] for g in param_groups(model, cfg, peak_lrs(cfg, batch * world))}


@pytest.mark.parametrize(
    "recipe,batch,world,encoder,gate,probe",
    [
        ("imagenet100-bayesncl", 128, 1, 0.15, 0.1, 0.05),  # their ImageNet-100 config
        ("cifar100-bayesncl", 256, 1, 0.4, 0.1, 0.1),  # their CIFAR config
        ("cifar100-bayesncl", 256, 8, 3.2, 0.1, 0.8),  # 8 processes of 256: lr x global batch / 256
    ],
)
def test_group_learning_rates(
    recipe: str, batch: int, world: int, encoder: float, gate: float, probe: float
) -> None:
    lrs = _lrs(recipe, batch=batch, world=world)
    want = {"encoder": encoder, "gating_head": gate, "classifier": probe}
    assert lrs == pytest.approx({f"{p}/{k}": want[p] for p in want for k in ("weight", "plain")})
    # the paper's wording instead (gate_lr=0): 0.25 x the backbone lr; 0.0375 at 1 x 128, 0.8 at 8 x 256
    ratio = _lrs(recipe, "method.gate_lr=0", batch=batch, world=world)
    assert ratio["gating_head/weight"] == pytest.approx(0.25 * encoder)


def test_lars_adapts_the_classifier_weight_not_its_bias() -> None:
    cfg = _cfg("method.name=ncl")
    model = build_model(cfg, 3, 16, 4)
    groups = {g["name"]: g for g in param_groups(model, cfg, peak_lrs(cfg, 256))}
    assert groups["classifier/weight"]["weight_decay"] == groups["classifier/plain"]["weight_decay"] == 0.0
    assert groups["classifier/weight"]["always_adapt"] and not groups["classifier/plain"]["always_adapt"]
    opt = build_optimizer(list(groups.values()), cfg)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    w, b = model.classifier.weight, model.classifier.bias
    w.grad, b.grad = torch.full_like(w, 3.0), torch.full_like(b, 3.0)
    w0, b0 = w.detach().clone(), b.detach().clone()
    opt.step()
    lr, eta = 0.1, cfg.train.lars_eta  # first step: the update is lr x clipped trust ratio x grad
    trust = min(eta * float(w0.norm()) / float(w.grad.norm()) / lr, 1.0)
    torch.testing.assert_close(w.detach(), w0 - lr * trust * w.grad)
    torch.testing.assert_close(b.detach(), b0 - lr * b.grad)  # 1-D: plain SGD


# ----------------------------------------------------------------------------- 5. warmup
def test_schedule_starts_every_group_at_warmup_start_and_peaks_at_w_minus_1() -> None:
    s = LrSchedule(total_steps=110, warmup_steps=10, start=3e-5, final=0.0)
    for peak in (0.4, 0.1, 0.025):
        assert s.at(0, peak) == 3e-5  # the same absolute start for every group (pl_bolts)
        assert s.at(5, peak) == pytest.approx(3e-5 + 5 * (peak - 3e-5) / 9)
        assert s.at(9, peak) == pytest.approx(peak)  # t = W - 1
        assert s.at(10, peak) == pytest.approx(peak)  # t = W: the cosine's first step
        assert s.at(60, peak) == pytest.approx(peak / 2)
    cfg = _cfg()
    model = build_model(cfg, 3, 16, 4)
    opt = build_optimizer(param_groups(model, cfg, peak_lrs(cfg, 256)), cfg)
    assert s.apply(opt, 0) == 3e-5 and {g["lr"] for g in opt.param_groups} == {3e-5}
    assert s.apply(opt, 9) == pytest.approx(0.4)
    assert {g["name"]: g["lr"] for g in opt.param_groups}["gating_head/weight"] == pytest.approx(0.1)


# ----------------------------------------------------------------------------- 6. positives by index
def _reference_loss(z: torch.Tensor, idx: list[int], t: float) -> float:
    """The authors' simclr_loss_func written out, in float64."""
    q = torch.nn.functional.normalize(z.double(), dim=1)
    s = torch.exp(q @ q.T / t)
    total = 0.0
    for i in range(len(idx)):
        pos = sum(float(s[i, j]) for j in range(len(idx)) if j != i and idx[j] == idx[i])
        neg = sum(float(s[i, j]) for j in range(len(idx)) if idx[j] != idx[i])
        total -= math.log(pos / (pos + neg))
    return total / len(idx)


def test_an_image_twice_in_a_batch_has_every_view_of_it_as_positive() -> None:
    torch.manual_seed(0)
    z = torch.randn(6, 4)  # n = 3 images per view; image 7 appears twice (rows 0 and 2)
    image = torch.tensor([7, 3, 7])
    idx = torch.cat([image, image])
    got = info_nce(z, 0.5, index=idx)
    assert float(got) == pytest.approx(_reference_loss(z, idx.tolist(), 0.5), rel=1e-5)
    assert abs(float(info_nce(z, 0.5)) - float(got)) > 1e-2  # row i+n alone would be wrong here
    distinct = torch.tensor([7, 3, 5]).repeat(2)  # no repeat: the same as the i+n positives
    assert float(info_nce(z, 0.5, index=distinct)) == pytest.approx(float(info_nce(z, 0.5)), rel=1e-6)
    # as rank 1 of 2 (keys gathered from both ranks): the rows of the full-batch loss
    keys, kidx = torch.randn(12, 4), torch.tensor([1, 7, 2, 1, 7, 2, 7, 3, 7, 7, 3, 7])
    keys[6:] = z
    local = info_nce(z, 0.5, keys=keys, offset=6, index=idx, key_index=kidx)
    q = torch.nn.functional.normalize(keys.double(), dim=1)
    s = torch.exp(q @ q.T / 0.5)
    want = []
    for i in range(6, 12):
        pos = sum(float(s[i, j]) for j in range(12) if j != i and kidx[j] == kidx[i])
        neg = sum(float(s[i, j]) for j in range(12) if kidx[j] != kidx[i])
        want.append(-math.log(pos / (pos + neg)))
    assert float(local) == pytest.approx(np.mean(want), rel=1e-5)


@pytest.mark.parametrize(("n", "batch", "world"), [(300, 16, 3), (301, 16, 4), (1000, 64, 8), (37, 4, 1)])
def test_our_sampler_never_repeats_an_image_in_a_global_batch(n: int, batch: int, world: int) -> None:
    """Why training passes no index: the epoch order is one permutation, truncated (not padded) to a
    multiple of world_size and rank-strided (data/loaders.py ``_epoch_order``, used by both train
    loaders), so at every step the global batch of world × batch images holds distinct dataset
    indices, and the authors' index-based positives are exactly rows i+n."""
    from bayesncl.data.loaders import _epoch_order

    for epoch in range(3):
        orders = [_epoch_order(n, 5, epoch, r, world) for r in range(world)]
        assert {len(o) for o in orders} == {n // world}
        for step in range((n // world) // batch):
            step_idx = torch.cat([o[step * batch : (step + 1) * batch] for o in orders])
            assert len(step_idx.unique()) == len(step_idx) == world * batch
            image = step_idx[:batch]  # one rank's images: their positives by index are rows i+n
            z = torch.randn(2 * batch, 6, generator=torch.Generator().manual_seed(step))
            assert float(info_nce(z, 0.2, index=torch.cat([image, image]))) == pytest.approx(
                float(info_nce(z, 0.2)), rel=1e-6)


def test_contrastive_head_passes_dataset_indices_to_the_loss() -> None:
    """A user loop with a padding sampler (e.g. DistributedSampler) gives the head its indices."""
    from bayesncl.core.head import ContrastiveHead

    torch.manual_seed(0)
    head = ContrastiveHead(10, _cfg("method.name=ncl"))
    h1, h2 = torch.randn(4, 10), torch.randn(4, 10)
    image = torch.tensor([3, 8, 3, 1])  # image 3 twice
    with torch.no_grad():
        loss, _ = head(h1, h2, index=image)
        out = head.project(torch.cat([h1, h2]))
        want = info_nce(out.z_tilde, 0.2, index=torch.cat([image, image]))
        assert float(loss) == pytest.approx(float(want), rel=1e-6)
        assert abs(float(loss) - float(head(h1, h2)[0])) > 1e-3


# ----------------------------------------------------------------------------- 7. Gumbel at tau_s = 2
def test_gumbel_gate_divides_logits_and_noise_by_tau() -> None:
    raw = torch.tensor([[0.3, -0.2, 1.0, -1.5, 0.05, 0.6]] * 64)  # the head's output l
    gate = Gate("gumbel", 0.5, "gumbel", tau=2.0).train()
    mask, alpha = gate(raw / 2.0, generator=torch.Generator().manual_seed(5))  # GatingHead gives l / tau
    g = gumbel_noise(raw.shape, "gumbel", generator=torch.Generator().manual_seed(5))
    theirs = torch.sigmoid((raw + g) / 2.0)  # bayesncl_helper_functions.py:29
    assert torch.equal(mask, (theirs > 0.5).float())
    torch.testing.assert_close(alpha, torch.sigmoid(raw / 2.0))  # the KL's alpha has no noise
    ours_before = torch.sigmoid(raw / 2.0 + g)
    assert ((ours_before > 0.5) != (theirs > 0.5)).any()  # the two formulas differ at tau_s = 2
    model = build_model(_cfg("method.name=bayesncl-gs", "method.gate_tau=2"), 3, 16, 4)
    assert model.gate is not None and model.gate.tau == 2.0


# ----------------------------------------------------------------------------- 8. blur against PIL's
def _images(n: int, side: int = 32) -> list[np.ndarray]:
    """Noise with flat blocks: fine detail and edges, so blur strength shows in the gradients."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        a = rng.integers(0, 256, (side, side, 3))
        for _ in range(6):
            x, y = rng.integers(0, side, 2)
            w, h = rng.integers(3, 16, 2)
            a[y : y + h, x : x + w] = rng.integers(0, 256, 3)
        out.append(a.astype(np.uint8))
    return out


def _energy(x: np.ndarray) -> float:
    """Mean squared finite difference of a (H, W, C) image in [0, 1]: falls as the blur grows."""
    return float((np.diff(x, axis=0) ** 2).mean() + (np.diff(x, axis=1) ** 2).mean())


def _blur_ops(spec: AugmentSpec):
    """The blur step of each executor (the spec has no other step but the crop)."""
    batched = BatchAugment(spec).ops[-1]
    per_sample = sample_transform(spec).transforms[-4]  # ..., blur, ToImage, ToDtype, Normalize
    assert "Blur" in type(batched).__name__ and "Blur" in type(per_sample.transforms[0]).__name__
    return batched, per_sample


def _spec(sigma: tuple[float, float] = (0.1, 2.0)) -> AugmentSpec:
    zero, one = (0.0,) * 3, (1.0,) * 3
    return AugmentSpec(32, 3, zero, one, jitter_p=0, gray_p=0, blur_p=1.0, blur_sigma=sigma, flip_p=0)


def _ours(images: list[np.ndarray], spec: AugmentSpec) -> tuple[list[float], list[float]]:
    batched, per_sample = _blur_ops(spec)
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255
    a = [_energy(v.permute(1, 2, 0).numpy()) for v in batched(x)]
    b = [_energy(np.asarray(per_sample(Image.fromarray(i)), dtype=np.float64) / 255) for i in images]
    return a, b


def _pil(image: np.ndarray, sigma: float) -> float:
    blurred = Image.fromarray(image).filter(ImageFilter.GaussianBlur(radius=sigma))
    return _energy(np.asarray(blurred, dtype=np.float64) / 255)


def test_blur_strength_follows_pils_gaussian_blur_over_sigma() -> None:
    import kornia

    images = _images(32)
    assert AugmentSpec.simclr(32, 3, (0.0,) * 3, (1.0,) * 3).blur_sigma == (0.1, 2.0)
    for sigma in (0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0):
        theirs = np.mean([_pil(i, sigma) for i in images])
        for ours in _ours(images, _spec((sigma, sigma))):
            assert np.mean(ours) / theirs == pytest.approx(1.0, abs=0.03), sigma
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255  # the former 3x3 kernel:
    old = [_energy(v.permute(1, 2, 0).numpy()) for v in kornia.filters.gaussian_blur2d(x, (3, 3), (2.0, 2.0))]
    assert np.mean(old) / np.mean([_pil(i, 2.0) for i in images]) > 5  # far weaker; the test tells them apart


def test_blur_with_random_sigma_matches_pil_in_distribution() -> None:
    """Two-sample Kolmogorov-Smirnov test on the blurred images' gradient energy: ours (sigma drawn
    by our executors) against PIL's with sigma ~ U(0.1, 2) (their ``random.uniform(0.1, 2.0)``)."""
    import kornia
    from scipy import stats

    image, n = _images(1)[0], 1000
    torch.manual_seed(0)
    ours_batched, ours_sample = _ours([image] * n, _spec())
    rng = np.random.default_rng(1)
    theirs = [_pil(image, float(s)) for s in rng.uniform(0.1, 2.0, n)]
    for ours in (ours_batched, ours_sample):
        assert stats.ks_2samp(ours, theirs).pvalue > 1e-3
    x = torch.from_numpy(np.stack([image] * n)).permute(0, 3, 1, 2).float() / 255
    old = kornia.augmentation.RandomGaussianBlur((3, 3), (0.1, 2.0), p=1.0)(x)  # the former blur at 32 px
    assert stats.ks_2samp([_energy(v.permute(1, 2, 0).numpy()) for v in old], theirs).pvalue < 1e-6


# ----------------------------------------------------------------------------- recipes
@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES.glob("*bayesncl*.yaml")))
def test_gated_recipes_run_the_authors_gate_lr(recipe: str) -> None:
    cfg = build_config(RECIPES / f"{recipe}.yaml")
    assert cfg.method.gate_lr == 0.1 and cfg.model.bn_views == "per_view" and cfg.model.stem_padding == 2
