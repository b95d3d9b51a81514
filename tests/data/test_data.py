"""bayesncl.data: loaders, subsets, errors and the two augmentation paths.

Every dataset here is generated in a tmp dir (fake idx files, CIFAR pickles, a PNG folder) or is
the built-in synthetic set: nothing is downloaded and no installed dataset is read.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bayesncl.config import DataConfig
from bayesncl.data import (
    AugmentSpec,
    BatchAugment,
    DataError,
    LazyImages,
    augment_spec,
    build_eval_loader,
    build_train_loader,
    clear_cache,
    dataset_info,
    load_split_images,
    mix_seed,
    sample_transform,
    stratified_subset,
)
from bayesncl.data.augment import pil_box_kernels, seeded
from bayesncl.data.sources import read_cached

from ..conftest import ROOT, write_fmnist

CPU = torch.device("cpu")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors gain nothing from intra-op threads, and on a shared 2-core machine spinning
    OpenMP threads made the kornia tests 10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _fresh_cache():
    read_cached.cache_clear()
    yield
    read_cached.cache_clear()


# ----------------------------------------------------------------------------- fake data on disk
def write_cifar(root: Path, name: str, per_file: int = 12) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(3)
    n_classes = 10 if name == "cifar10" else 100
    if name == "cifar10":
        d = root / "cifar-10-batches-py"
        files = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
        key, meta_file, meta = "labels", "batches.meta", {"label_names": [f"c{i}" for i in range(10)]}
    else:
        d = root / "cifar-100-python"
        files = {"train": ["train"], "test": ["test"]}
        key, meta_file, meta = "fine_labels", "meta", {"fine_label_names": [f"f{i}" for i in range(100)]}
    d.mkdir(parents=True)
    (d / meta_file).write_bytes(pickle.dumps(meta, protocol=2))
    out = {}
    for split, names in files.items():
        xs, ys = [], []
        for f in names:
            n = per_file * (5 if name == "cifar100" and split == "train" else 1)
            y = rng.integers(0, n_classes, n)
            x = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
            entry = {"data": x, key: y.tolist(), "filenames": [f"{i}.png" for i in range(n)]}
            (d / f).write_bytes(pickle.dumps(entry, protocol=2))
            xs.append(x.reshape(-1, 3, 32, 32))
            ys.append(y)
        out[split] = (np.concatenate(xs), np.concatenate(ys))
    return out


def write_folder(root: Path, corrupt: bool = True) -> Path:
    rng = np.random.default_rng(4)
    for split, n in (("train", 6), ("val", 2)):
        for ci, cls in enumerate(("cat", "dog")):
            d = root / split / cls
            d.mkdir(parents=True)
            for i in range(n):
                h, w = int(rng.integers(30, 50)), int(rng.integers(30, 50))
                a = np.zeros((h, w, 3), np.uint8)
                a[..., ci] = 200
                a[: h // 2] += np.uint8(i * 5)
                Image.fromarray(a).save(d / f"{i}.png")
    bad = root / "train" / "dog" / "bad.png"
    if corrupt:
        bad.write_bytes(b"this is not a PNG file")
    return bad


@pytest.fixture()
def fmnist(tmp_path):
    arrays = write_fmnist(tmp_path / "fm")
    return DataConfig(name="fashion-mnist", root=str(tmp_path / "fm")), arrays


@pytest.fixture(scope="module")
def synthetic_cfg():
    return DataConfig(name="synthetic", train_subset=300, test_subset=100)


# ----------------------------------------------------------------------------- datasets
def test_fmnist_reads_idx_files(fmnist):
    cfg, arrays = fmnist
    info = dataset_info(cfg)
    assert (info.num_classes, info.channels, info.image_size) == (10, 1, 28)
    assert (info.num_train, info.num_test) == (60, 20)
    assert info.class_names[0] == "T-shirt/top" and info.class_names[9] == "Ankle boot"
    for split in ("train", "test"):
        images, labels = load_split_images(cfg, split)
        assert images.dtype == torch.uint8 and images.shape == (len(arrays[split][1]), 1, 28, 28)
        np.testing.assert_array_equal(images[:, 0].numpy(), arrays[split][0])
        np.testing.assert_array_equal(labels.numpy(), arrays[split][1])


def test_fmnist_torchvision_raw_layout_ungzipped(tmp_path):
    arrays = write_fmnist(tmp_path / "FashionMNIST" / "raw", gz=False)
    cfg = DataConfig(name="fashion-mnist", root=str(tmp_path))
    images, labels = load_split_images(cfg, "test")
    np.testing.assert_array_equal(labels.numpy(), arrays["test"][1])
    np.testing.assert_array_equal(images[:, 0].numpy(), arrays["test"][0])


def test_fmnist_images_and_labels_of_different_lengths_are_named(tmp_path):
    """A labels file of the other split (10,000 labels for 60,000 images) says what it found."""
    d = tmp_path / "fm"
    write_fmnist(d, n_train=60, n_test=20)
    (d / "train-labels-idx1-ubyte.gz").write_bytes((d / "t10k-labels-idx1-ubyte.gz").read_bytes())
    with pytest.raises(DataError) as e:
        load_split_images(DataConfig(name="fashion-mnist", root=str(d)), "train")
    assert str(e.value) == (
        f"{d}/train-images-idx3-ubyte.gz / {d}/train-labels-idx1-ubyte.gz: expected (N, H, W) images and "
        "(N,) labels; found images of shape (60, 28, 28) and labels of shape (20,)"
    )


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_pickles(tmp_path, name):
    arrays = write_cifar(tmp_path, name)
    cfg = DataConfig(name=name, root=str(tmp_path))
    info = dataset_info(cfg)
    assert info.channels == 3 and info.image_size == 32
    assert info.num_classes == (10 if name == "cifar10" else 100)
    assert info.num_train == 60 and info.num_test == 12
    for split in ("train", "test"):
        images, labels = load_split_images(cfg, split)
        np.testing.assert_array_equal(images.numpy(), arrays[split][0])
        np.testing.assert_array_equal(labels.numpy(), arrays[split][1])


def test_synthetic_is_deterministic_and_balanced(synthetic_cfg):
    from bayesncl.data.synthetic import _synthetic

    x, y = _synthetic("test")
    x2, y2 = _synthetic.__wrapped__("test")
    assert torch.equal(x, x2) and np.array_equal(y, y2)
    assert x.shape == (1000, 3, 32, 32) and x.dtype == torch.uint8
    assert np.bincount(y).tolist() == [100] * 10
    info = dataset_info(synthetic_cfg)
    assert (info.num_train, info.num_test, info.channels) == (300, 100, 3)
    # learnable: 1-NN on centred gray pixels (polarity-invariant) is far above chance
    xtr, ytr = _synthetic("train")

    def f(t):
        g = t[:2000].float().mean(1).flatten(1)
        g = g - g.mean(1, keepdim=True)
        return g / g.norm(dim=1, keepdim=True)

    pred = ytr[:2000][(f(x)[:300] @ f(xtr).T).abs().argmax(1).numpy()]
    assert (pred == y[:300]).mean() > 0.5


def test_imagefolder_corrupt_file_named(tmp_path):
    bad = write_folder(tmp_path)
    cfg = DataConfig(name="imagefolder", root=str(tmp_path), image_size=32)
    with pytest.raises(DataError, match="bad.png") as e:
        dataset_info(cfg)
    assert "skip_corrupt" in str(e.value) and "\n" not in str(e.value)
    assert str(bad) in str(e.value)


def test_imagefolder_skip_corrupt(tmp_path, caplog):
    write_folder(tmp_path)
    cfg = DataConfig(name="imagefolder", root=str(tmp_path), image_size=32, skip_corrupt=True)
    with caplog.at_level(logging.WARNING, logger="bayesncl.data"):
        info = dataset_info(cfg)
    assert "corrupt" in caplog.text and "bad.png" in caplog.text
    assert info.class_names == ("cat", "dog") and info.num_train == 12 and info.num_test == 4
    loader = build_train_loader(cfg, 4, seed=0, device=CPU)
    assert not loader.resident and loader.num_skipped == 1 and len(loader) == 3
    x1, x2, y = next(iter(loader))
    assert x1.shape == x2.shape == (4, 3, 32, 32) and y.dtype == torch.int64
    ev = build_eval_loader(cfg, "test", 3, device=CPU)
    batches = list(ev)
    assert len(ev) == len(batches) == 2 and batches[0][0].shape == (3, 3, 32, 32)
    assert torch.cat([b[2] for b in batches]).tolist() == [0, 1, 2, 3]
    assert torch.cat([b[1] for b in batches]).tolist() == [0, 0, 1, 1]
    images, labels = load_split_images(cfg, "train")
    assert isinstance(images, LazyImages) and images.shape == (12, 3, 32, 32)
    assert images[[0, 11]].shape == (2, 3, 32, 32) and images[0].dtype == torch.uint8
    assert labels.tolist() == [0] * 6 + [1] * 6
    # resident=true decodes the folder once
    res = build_train_loader(dataclasses.replace(cfg, resident="true"), 4, seed=0, device=CPU)
    assert res.resident and next(iter(res))[0].shape == (4, 3, 32, 32)


def test_imagefolder_corrupt_at_load_time(tmp_path, monkeypatch):
    """Folders above VERIFY_MAX_FILES are not verified upfront: the failure comes at decode time."""
    import bayesncl.data.folders as folders

    write_folder(tmp_path)
    monkeypatch.setattr(folders, "VERIFY_MAX_FILES", 0)
    cfg = DataConfig(name="imagefolder", root=str(tmp_path), image_size=32, train_subset=0)
    images, _ = load_split_images(cfg, "train")
    with pytest.raises(DataError, match="bad.png"):
        images[12]  # sorted: dog/0.png ... dog/5.png, dog/bad.png
    read_cached.cache_clear()
    images, _ = load_split_images(dataclasses.replace(cfg, skip_corrupt=True), "train")
    assert len(images) == 13 and images[12].shape == (3, 32, 32)  # replaced by the next readable one
    assert images._src.num_skipped == 1



def test_imagefolder_class_list_selects_and_orders_classes(tmp_path):
    """data.classes takes e.g. ImageNet-100 from a full ImageNet folder: only the listed classes,
    labelled in sorted order (as a ready-made folder of just those classes would be)."""
    write_folder(tmp_path, corrupt=False)  # cat, dog: 6 train + 2 val images each
    for split in ("train", "val"):
        (tmp_path / split / "ant").mkdir()
        Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / split / "ant" / "0.png")
    listing = tmp_path / "classes.txt"
    listing.write_text("# two of the three classes\ndog\n\n cat, # a comment\n")
    cfg = DataConfig(name="imagefolder", root=str(tmp_path), image_size=32, classes=str(listing))
    info = dataset_info(cfg)
    assert info.class_names == ("cat", "dog") and (info.num_train, info.num_test) == (12, 4)
    _, labels = load_split_images(cfg, "train")
    assert labels.tolist() == [0] * 6 + [1] * 6
    listing.write_bytes("\ufeffdog\r\n".encode())  # saved with a byte-order mark and CRLF
    read_cached.cache_clear()
    _, labels = load_split_images(cfg, "test")
    assert dataset_info(cfg).class_names == ("dog",) and labels.tolist() == [0, 0]
    bad = {
        "cat\nzebra\nyak\n": f"{tmp_path / 'train'} lacks 2 of the 3 classes listed in data.classes: "
        "yak, zebra",
        "cat dog\ncat\n": f"data.classes={listing}: repeated class name(s) cat",
        "# nothing\n\n": f"data.classes={listing}: the file lists no class folder names",
    }
    for text, message in bad.items():
        listing.write_text(text)
        read_cached.cache_clear()
        with pytest.raises(DataError) as e:
            dataset_info(cfg)
        assert str(e.value) == message
    with pytest.raises(DataError, match=r"^data.classes=.*nope.txt: cannot read the class list \(No such"):
        dataset_info(dataclasses.replace(cfg, classes=str(tmp_path / "nope.txt")))


def test_class_list_is_for_image_folders_only():
    from bayesncl.config import ConfigError, build_config

    with pytest.raises(ConfigError) as e:
        build_config(overrides=["data.name=cifar10", "data.classes=list.txt"])
    expected = "data.classes=list.txt: a class list selects folders of data.name=imagefolder, not cifar10"
    assert str(e.value) == expected


# ----------------------------------------------------------------------------- errors
def test_missing_and_empty_dirs(tmp_path):
    missing = tmp_path / "nowhere"
    for root in (missing, tmp_path):  # tmp_path exists but is empty
        with pytest.raises(DataError) as e:
            dataset_info(DataConfig(name="fashion-mnist", root=str(root)))
        msg = str(e.value)
        assert str(root) in msg and "apt-get install dataset-fashion-mnist" in msg
        assert "data.download=true" in msg and "\n" not in msg
    with pytest.raises(DataError) as e:
        dataset_info(DataConfig(name="cifar10", root=str(missing)))
    assert str(missing) in str(e.value) and "cifar-10-batches-py" in str(e.value)
    assert "data.download=true" in str(e.value)
    (tmp_path / "train").mkdir()
    with pytest.raises(DataError, match="empty") as e:
        dataset_info(DataConfig(name="imagefolder", root=str(tmp_path)))
    assert str(tmp_path / "train") in str(e.value)
    with pytest.raises(DataError, match="data.root"):
        dataset_info(DataConfig(name="imagefolder"))
    assert issubclass(DataError, ValueError)


def test_batch_size_errors(fmnist):
    cfg, _ = fmnist
    with pytest.raises(DataError, match=r"batch_size=64 .* 60 training samples"):
        build_train_loader(cfg, 64, seed=0, device=CPU)
    with pytest.raises(DataError, match="30 per rank"):
        build_train_loader(cfg, 40, seed=0, device=CPU, rank=1, world_size=2)
    with pytest.raises(DataError, match=">= 2"):
        build_train_loader(cfg, 1, seed=0, device=CPU)


# ----------------------------------------------------------------------------- subsets
def test_stratified_subset_deterministic():
    labels = np.repeat(np.arange(5), [40, 30, 20, 6, 4])
    a = stratified_subset(labels, 50)
    assert len(a) == 50 and np.array_equal(a, stratified_subset(labels, 50))
    assert np.bincount(labels[a]).tolist() == [20, 15, 10, 3, 2]
    assert np.all(np.diff(a) > 0)
    assert not np.array_equal(a, stratified_subset(labels, 50, seed=1))
    odd = stratified_subset(labels, 7)
    assert len(odd) == 7 and len(np.unique(labels[odd])) >= 3
    assert len(stratified_subset(labels, 0)) == len(stratified_subset(labels, 10**6)) == 100


def test_subset_in_config(fmnist):
    cfg, arrays = fmnist
    cfg = dataclasses.replace(cfg, train_subset=30, test_subset=10)
    info = dataset_info(cfg)
    assert (info.num_train, info.num_test) == (30, 10)
    images, labels = load_split_images(cfg, "train")
    assert np.bincount(labels.numpy(), minlength=10).tolist() == [3] * 10
    assert torch.equal(labels, load_split_images(cfg, "train")[1])
    # the pairing of images and labels survives subsetting (pixel (0,0) encodes the label)
    assert torch.equal(images[:, 0, 0, 0].long(), labels * 20)


# ----------------------------------------------------------------------------- resident path
def _epoch(loader, epoch):
    loader.set_epoch(epoch)
    return list(loader)


def test_resident_loader_shapes_and_determinism(synthetic_cfg):
    loader = build_train_loader(synthetic_cfg, 64, seed=3, device=CPU)
    assert loader.resident and len(loader) == 300 // 64
    state = torch.get_rng_state()
    a = _epoch(loader, 0)
    assert torch.equal(state, torch.get_rng_state()), "the caller's global RNG must not be disturbed"
    x1, x2, y = a[0]
    assert x1.shape == x2.shape == (64, 3, 32, 32) and x1.dtype == torch.float32 and x1.device == CPU
    assert y.shape == (64,) and y.dtype == torch.int64
    assert not torch.equal(x1, x2), "the two views must differ"
    assert abs(float(torch.cat([b[0] for b in a]).mean())) < 0.5
    torch.manual_seed(123)  # a different caller RNG state changes nothing
    b = _epoch(loader, 0)
    assert all(torch.equal(u, v) for p, q in zip(a, b, strict=True) for u, v in zip(p, q, strict=True))
    c = _epoch(loader, 1)
    assert not torch.equal(a[0][0], c[0][0]) and not torch.equal(a[0][2], c[0][2])
    # a fresh loader (resumed run) reproduces the epoch; mid-epoch resume skips steps exactly
    fresh = build_train_loader(synthetic_cfg, 64, seed=3, device=CPU)
    fresh.set_epoch(1, start_step=2)
    d = list(fresh)
    assert len(d) == len(c) - 2 and torch.equal(d[0][0], c[2][0]) and torch.equal(d[0][1], c[2][1])
    other_seed = build_train_loader(synthetic_cfg, 64, seed=4, device=CPU)
    assert not torch.equal(_epoch(other_seed, 0)[0][0], a[0][0])


def test_rank_shards_disjoint_and_cover(synthetic_cfg):
    loaders = [
        build_train_loader(synthetic_cfg, 16, seed=0, device=CPU, rank=r, world_size=3) for r in range(3)
    ]
    for ld in loaders:
        ld.set_epoch(2)
    orders = [ld._order() for ld in loaders]
    assert len({len(o) for o in orders}) == 1 and len({len(ld) for ld in loaders}) == 1
    allidx = torch.cat(orders)
    assert len(allidx.unique()) == len(allidx) == 300
    _, labels = load_split_images(synthetic_cfg, "train")
    x1, _, y = next(iter(loaders[1]))
    assert torch.equal(y, labels[orders[1][:16]])
    # different ranks get different augmentation streams and batches
    assert not torch.equal(next(iter(loaders[0]))[0], x1)


def test_eval_loader_normalises_constant_image(tmp_path):
    const = round(0.2860 * 255)  # Fashion-MNIST's mean
    write_fmnist(tmp_path, n_train=40, n_test=10, const=const)
    cfg = DataConfig(name="fashion-mnist", root=str(tmp_path))
    xs = list(build_eval_loader(cfg, "train", 16, device=CPU))
    assert [len(b[0]) for b in xs] == [16, 16, 8]
    assert float(xs[0][0].abs().max()) < 0.01
    assert torch.equal(torch.cat([b[2] for b in xs]), torch.arange(40))
    train = build_train_loader(cfg, 20, seed=0, device=CPU)
    x1, x2, _ = next(iter(train))
    assert abs(float(torch.cat([x1, x2]).mean())) < 0.35  # only the jitter moves a constant image
    big = dataclasses.replace(cfg, image_size=32)
    x, y, idx = next(iter(build_eval_loader(big, "test", 4, device=CPU)))
    assert x.shape == (4, 1, 32, 32) and y.shape == idx.shape == (4,)
    assert next(iter(build_train_loader(big, 4, seed=0, device=CPU)))[0].shape == (4, 1, 32, 32)
    assert load_split_images(big, "test")[0].shape == (10, 1, 32, 32)


# ----------------------------------------------------------------------------- per-sample path
def test_per_sample_path_gray_and_workers(fmnist):
    cfg, _ = fmnist
    cfg = dataclasses.replace(cfg, resident="false")
    loader = build_train_loader(cfg, 8, seed=1, device=CPU)
    assert not loader.resident and len(loader) == 60 // 8
    state = torch.get_rng_state()
    a = _epoch(loader, 5)
    assert torch.equal(state, torch.get_rng_state())
    x1, x2, y = a[0]
    assert x1.shape == x2.shape == (8, 1, 28, 28) and x1.dtype == torch.float32 and y.dtype == torch.int64
    assert not torch.equal(x1, x2)
    b = _epoch(loader, 5)
    assert all(torch.equal(p[0], q[0]) for p, q in zip(a, b, strict=True))
    assert not torch.equal(_epoch(loader, 6)[0][0], x1)
    # the batches do not depend on the number of workers
    w = build_train_loader(dataclasses.replace(cfg, num_workers=1), 8, seed=1, device=CPU)
    c = _epoch(w, 5)
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[2], q[2]) for p, q in zip(a, c, strict=True))
    t0 = time.perf_counter()
    del w  # no reference cycle: the persistent worker shuts down at once (it once waited 5 s)
    assert time.perf_counter() - t0 < 2.5


def test_per_sample_and_resident_same_order(synthetic_cfg):
    res = build_train_loader(synthetic_cfg, 32, seed=0, device=CPU)
    per = build_train_loader(dataclasses.replace(synthetic_cfg, resident="false"), 32, seed=0, device=CPU)
    assert len(res) == len(per)
    for ld in (res, per):
        ld.set_epoch(3)
    (r1, _, ry), (p1, _, py) = next(iter(res)), next(iter(per))
    assert torch.equal(ry, py) and r1.shape == p1.shape == (32, 3, 32, 32)
    for t in (r1, p1):  # both normalised: roughly zero mean, unit spread
        assert abs(float(t.mean())) < 0.4 and 0.6 < float(t.std()) < 1.4


# ----------------------------------------------------------------------------- augmentation
def _ramp(n: int = 256, s: int = 32) -> torch.Tensor:
    r = torch.linspace(0, 1, s)
    img = torch.stack([r.view(1, s).expand(s, s), r.view(s, 1).expand(s, s), torch.full((s, s), 0.5)])
    return img.unsqueeze(0).expand(n, 3, s, s).contiguous()


def _crop_stats(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample (area fraction, flipped) from augmented x/y ramp images."""
    s = out.shape[-1]
    xr, yr = out[:, 0], out[:, 1]
    w = (xr.amax((1, 2)) - xr.amin((1, 2))) * (s - 1) / s + 1 / s
    h = (yr.amax((1, 2)) - yr.amin((1, 2))) * (s - 1) / s + 1 / s
    flipped = xr[:, :, 0].mean(1) > xr[:, :, -1].mean(1)
    return w * h, flipped


def _geom_spec(min_scale: float) -> AugmentSpec:
    return AugmentSpec(
        size=32, channels=3, mean=(0.0,) * 3, std=(1.0,) * 3, crop_min_scale=min_scale,
        jitter_p=0.0, gray_p=0.0, blur_p=0.0,
    )


def test_crop_scale_and_flip_applied_on_both_paths():
    x = _ramp(400)
    spec = _geom_spec(0.08)
    with seeded(0):
        area_k, flip_k = _crop_stats(BatchAugment(spec)(x))
    tf = sample_transform(spec)
    pil = Image.fromarray((x[0] * 255).round().byte().permute(1, 2, 0).numpy())
    with seeded(0):
        area_t, flip_t = _crop_stats(torch.stack([tf(pil) for _ in range(400)]))
    for area, flip in ((area_k, flip_k), (area_t, flip_t)):
        assert 0.4 < flip.float().mean() < 0.6
        assert area.min() > 0.05 and area.max() <= 1.05
        assert (area < 0.3).float().mean() > 0.1 and (area > 0.7).float().mean() > 0.1
    assert abs(float(area_k.mean() - area_t.mean())) < 0.07  # one distribution, two executors
    with seeded(1):
        area_big, _ = _crop_stats(BatchAugment(_geom_spec(0.6))(x))
    assert area_big.min() > 0.5


def test_spec_gray_and_blur_kernel(fmnist):
    cfg, _ = fmnist
    spec = augment_spec(cfg)
    assert spec.channels == 1 and spec.saturation == 0 and spec.hue == 0 and spec.gray_p == 0
    assert spec.brightness == spec.contrast == 0.8 and spec.jitter_p == 0.8 and spec.flip_p == 0.5
    assert spec.blur_sigma == (0.1, 2.0)  # PIL's blur at any size (issue 13 item 8; was 3x3 at 28 px)
    boxes = pil_box_kernels(torch.tensor([0.1, 1.0, 2.0]), 2.0)  # PIL blurs 3 times with the box
    assert boxes.shape == (3, 5) and torch.allclose(boxes.sum(1), torch.ones(3, dtype=torch.float64))
    var = (boxes * torch.arange(-2, 3, dtype=torch.float64) ** 2).sum(1)
    torch.testing.assert_close(3 * var, torch.tensor([0.01, 1.0, 4.0], dtype=torch.float64))  # sigma^2
    rgb = augment_spec(DataConfig(name="synthetic", blur_prob=0.0, crop_min_scale=0.2))
    assert rgb.gray_p == 0.2 and rgb.hue == 0.2 and rgb.blur_p == 0.0 and rgb.crop_min_scale == 0.2
    assert mix_seed(1, 2) != mix_seed(2, 1) and mix_seed(0) == mix_seed(0) >= 0


CMC_LIST = ROOT.parent / "shared" / "data" / "imagenet100_classes.txt"


@pytest.mark.skipif(not CMC_LIST.is_file(), reason="the team's copy of the CMC ImageNet-100 list is not here")
def test_the_cmc_imagenet100_list_reads_as_100_wordnet_ids():
    from bayesncl.data.folders import read_class_list

    names = read_class_list(CMC_LIST)
    assert len(names) == 100 and all(n.startswith("n") and len(n) == 9 for n in names)


def test_a_failed_download_leaves_the_disk_as_it_was(tmp_path, monkeypatch):
    """Offline (or any failure mid-download): one line, and every file and folder the download made is
    removed again; what was there before stays."""
    import torchvision.datasets

    def offline(root, train=True, download=False):
        raw = Path(root) / "FashionMNIST" / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        (raw / "train-images-idx3-ubyte.gz.part").write_bytes(b"half")
        raise OSError("<urlopen error [Errno -3] Temporary failure in name resolution>")

    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", offline)
    new = tmp_path / "new"
    with pytest.raises(DataError) as e:
        dataset_info(DataConfig(name="fashion-mnist", root=str(new), download=True))
    assert str(e.value) == (
        f"downloading Fashion-MNIST into {new} failed (<urlopen error [Errno -3] Temporary failure in "
        "name resolution>): copy the files there by hand, or set data.root"
    )
    assert not new.exists()
    mine = tmp_path / "mine"
    (mine / "FashionMNIST").mkdir(parents=True)
    (mine / "notes.txt").write_text("kept")
    read_cached.cache_clear()
    with pytest.raises(DataError):
        dataset_info(DataConfig(name="fashion-mnist", root=str(mine), download=True))
    assert sorted(str(p.relative_to(mine)) for p in mine.rglob("*")) == ["FashionMNIST", "notes.txt"]


def test_a_download_error_without_its_reason_gets_one(tmp_path, monkeypatch):
    """torchvision's first line ("Error downloading X:") says no reason: the cause, else the usual one."""
    import torchvision.datasets

    from bayesncl.data.download import download_failure

    def no_reason(root, train=True, download=False):
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz:\n")

    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", no_reason)
    with pytest.raises(DataError) as e:
        dataset_info(DataConfig(name="fashion-mnist", root=str(tmp_path / "a"), download=True))
    assert str(e.value) == (
        f"downloading Fashion-MNIST into {tmp_path / 'a'} failed (Error downloading "
        "train-images-idx3-ubyte.gz: no network connection, or the server refused it): copy the files there "
        "by hand, or set data.root"
    )
    err = RuntimeError("Error downloading x.gz:")
    err.__cause__ = ConnectionRefusedError(111, "Connection refused")
    assert download_failure(err) == "Error downloading x.gz: [Errno 111] Connection refused"
    two_mirrors = RuntimeError(
        "Error downloading x.gz:\nTried http://a/, got:\n<urlopen error timed out>\n"
        "Tried http://b/, got:\n<urlopen error timed out>\n"
    )
    assert download_failure(two_mirrors) == "Error downloading x.gz: <urlopen error timed out>"
    assert download_failure(OSError()) == "OSError"


def test_a_subset_larger_than_the_split_warns_and_uses_the_whole_split() -> None:
    from bayesncl.data import load_split_images

    cfg = DataConfig(name="synthetic", train_subset=0, test_subset=1001)  # the synthetic test split: 1000
    clear_cache()  # the warning is given once per process
    with pytest.warns(UserWarning, match=r"^data.test_subset=1001 is more than the 1000 images of the test "
                      r"split: the whole split is used$"):
        images, labels = load_split_images(cfg, "test")
    assert len(labels) == 1000


def test_a_subset_larger_than_the_split_warns_once() -> None:
    """Every loader of a run (dataset_info, the train loader, the eval loaders) loads the split again:
    ``pretrain`` printed the same warning 6 times, ``evaluate`` 8 times."""
    import warnings

    cfg = DataConfig(name="synthetic", train_subset=0, test_subset=1002)
    clear_cache()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # Python's own once-per-location filter must not hide repeats
        assert dataset_info(cfg).num_test == 1000
        assert len(load_split_images(cfg, "test")[1]) == 1000
        build_eval_loader(cfg, "test", 500, device=torch.device("cpu"))
    messages = [str(w.message) for w in caught if "test_subset=1002" in str(w.message)]
    assert messages == [
        "data.test_subset=1002 is more than the 1000 images of the test split: the whole split is used"
    ]


# ----------------------------------------------------------------------------- folder held in memory
def test_folder_decoded_size_and_memory_decision(tmp_path, monkeypatch):
    """The estimate reads the headers (all 12 here: exact); the folder is held when it takes at most
    half of the available memory, and the line says which and why."""
    import bayesncl.data.images as images

    write_folder(tmp_path, corrupt=False)
    paths = sorted(str(p) for p in (tmp_path / "train").rglob("*.png"))
    exact = sum(Image.open(p).size[0] * Image.open(p).size[1] * 3 for p in paths)
    assert images.decoded_size(paths) == exact and 12 * 30 * 30 * 3 <= exact <= 12 * 50 * 50 * 3
    assert images.decoded_size(paths, samples=2) == round((exact_of(paths[0]) + exact_of(paths[-1])) / 2 * 12)
    monkeypatch.setattr(images, "available_memory", lambda: 2 * exact)
    hold, note = images.memory_decision(paths)
    assert hold and note.startswith("image folder held in memory: 12 images, ~") and "<= 50% of the" in note
    hold, note = images.memory_decision(paths, copies=2)  # two processes of one node hold a copy each
    assert not hold and note.startswith("image folder read from disk: 12 images")
    assert "x 2 processes > 50% of the" in note
    monkeypatch.setattr(images, "available_memory", lambda: None)
    assert images.memory_decision(paths) == (
        False, f"image folder read from disk (12 images, ~{exact / 2**20:,.1f} MiB decoded; the free memory "
        "is unknown here)")


def exact_of(path: str) -> int:
    w, h = Image.open(path).size
    return w * h * 3


def test_folder_held_in_memory_gives_the_same_batches(tmp_path, monkeypatch):
    """data.resident=auto holds a small folder decoded in memory (no file read afterwards) and
    trains on exactly the batches that reading the files (data.resident=false) gives."""
    import bayesncl.data.images as images

    write_folder(tmp_path, corrupt=False)
    monkeypatch.setattr(images, "available_memory", lambda: 2**30)
    cfg = DataConfig(name="imagefolder", root=str(tmp_path), image_size=24)
    held = build_train_loader(cfg, 4, seed=3, device=CPU)
    disk = build_train_loader(dataclasses.replace(cfg, resident="false"), 4, seed=3, device=CPU)
    assert not held.resident and held.note.startswith("image folder held in memory: 12 images")
    assert disk.note == "image folder read from disk (data.resident=false)"
    for p in (tmp_path / "train").rglob("*.png"):
        p.unlink()  # held: nothing is read from disk any more
    with pytest.raises(DataError):
        next(iter(disk))
    disk = None
    read_cached.cache_clear()
    write_folder(tmp_path / "again", corrupt=False)
    disk = build_train_loader(
        dataclasses.replace(cfg, root=str(tmp_path / "again"), resident="false"), 4, seed=3, device=CPU
    )
    for epoch in (0, 1):
        held.set_epoch(epoch)
        disk.set_epoch(epoch)
        pairs = list(zip(held, disk, strict=True))
        assert len(pairs) == 3
        for a, b in pairs:
            assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
