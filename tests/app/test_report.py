"""The HTML report: hand-checked dimension numbers, a site whose every link and image resolves, and
(where Chromium is installed) a real browser opening it from file://."""

from __future__ import annotations

import re
import shutil
import subprocess
from html import escape
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np
import pytest

from bayesncl.app.report import dimensions as dm

from ..conftest import ERROR, TINY

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


# ----------------------------------------------------------------------------- the numbers
def _feats() -> dict[str, np.ndarray]:
    f = np.zeros((6, 4), dtype=np.float32)
    f[:, 0] = [3, 2, 1, 0, 0, 0]  # fires on rows 0-2: labels 0, 0, 1
    f[:, 1] = [0, 0, 0, 1, 2, 4]  # rows 3-5: labels 1, 2, 2
    f[:, 3] = -f[:, 0]  # |z̃| fires where dim 0 does; r(0, 3) = -1
    mask = np.ones((6, 4), dtype=np.float32)
    mask[[3, 4], 0] = 0  # dim 0's gate closed on rows 3 and 4
    z = f.copy()
    z[3, 0], z[4, 0] = 0.5, 2.0  # pre-gate values of the closed rows: row 4 first
    return {"features": f, "labels": np.array([0, 0, 1, 1, 2, 2]), "indices": np.arange(6) + 10,
            "mask": mask, "z": z}


def test_summary_by_hand() -> None:
    rows = dm.summarise(_feats(), 3)
    assert [r.dim for r in rows] == [0, 1, 3]  # dim 2 never fires
    r0 = rows[0]
    assert r0.majority == 0 and r0.majority_share == pytest.approx(2 / 3)
    assert r0.sc == pytest.approx(2 / 3)  # the largest class share among its firing images
    assert r0.firing_rate == pytest.approx(0.5)
    assert r0.mean_activation == pytest.approx(1.0)
    assert r0.gate_open == pytest.approx(4 / 6)
    assert rows[1].majority == 2 and rows[1].majority_share == pytest.approx(2 / 3)
    assert dm.summarise({k: v for k, v in _feats().items() if k != "mask"}, 3)[0].gate_open is None
    assert r0.tied == 1 and rows[1].tied == 1


def _dim_page(f: np.ndarray, labels: np.ndarray) -> tuple[dm.DimSummary, str, str]:
    """Dimension 0 of features ``f`` (N, 1): its index row and the rendered index and page (an
    ungated run, classes named c0, c1, ...)."""
    from types import SimpleNamespace

    from bayesncl.app.report.html import _env

    row = dm.summarise({"features": f, "labels": labels}, 10)[0]
    cfg = SimpleNamespace(method=SimpleNamespace(name="ncl"), data=SimpleNamespace(name="synthetic"))
    common = {"run": SimpleNamespace(label="r", cfg=cfg), "gated": False, "cls": "c{}".format, "root": "../"}
    index = _env().get_template("dims.html").render(rows=[row], **common)
    counts = dm.class_fire_counts(f > 0, labels, 10)
    d = dm.detail({"features": f, "labels": labels}, 0, counts, [])
    page = _env().get_template("dim.html").render(
        d=d, s=row, cell=lambda r: {"src": "", "cls": ""}, bars=dm.svg_bars(d.hist[0]), f=f, names=[],
        **common,
    )
    return row, index, re.sub(r"\s+", " ", page)


def test_a_tie_names_no_majority_class() -> None:
    f = np.zeros((30, 1), dtype=np.float32)
    f[:10] = 1  # fires on one image of each of 10 classes: a 10-way tie
    row, index, page = _dim_page(f, np.arange(30) % 10)
    assert row.tied == 10 and row.majority_share == pytest.approx(0.1)
    assert "tie (10 classes)" in index and ">c0<" not in index
    assert "no majority class: a tie of 10 classes" in page and "majority class c0" not in page
    assert "fires on 33.3 % of the test images (10)" in page and "20 images where it is 0" in page


def test_a_dimension_active_on_every_image_is_called_not_selective() -> None:
    """The page and the index say the same of it (DimSummary.selectivity), and the index names no
    majority class (nor its share) for it."""
    labels = np.arange(40) % 10
    f = np.linspace(1, 2, 40, dtype=np.float32)[:, None]  # fires on all 40 images
    row, index, page = _dim_page(f, labels)
    assert row.unselective and "active on all 40 test images: not selective" in page
    assert "majority" not in page and "fires on 100.0 %" not in page
    assert "on all test images (40 images" in page and "where it is 0" not in page
    assert '<td class="l">not selective</td>\n<td data-v="-1">–</td>' in index and "tie (" not in index
    assert "firing on at least 95.0 % of the test images" in index
    f[:2] = 0  # 38 of 40 (95 %): nearly every image
    _, index, page = _dim_page(f, labels)
    assert "active on all but 2 of the 40 test images: hardly selective" in page
    assert "2 images where it is 0 are not drawn" in page
    assert '<td class="l">hardly selective</td>\n<td data-v="-1">–</td>' in index
    f[:3] = 0  # 37 of 40: selective enough to name its classes
    row, index, page = _dim_page(f, labels)
    assert not row.unselective and "selective" not in page
    assert "fires on 92.5 % of the test images (37)" in page
    assert '<td class="l">tie (7 classes)</td>\n<td>10.8</td>' in index  # classes 3-9: 4 of the 37 each


def test_percentages_never_round_a_firing_dim_to_zero() -> None:
    from bayesncl.app.report.html import _pct

    assert [_pct(v) for v in (None, float("nan"), 0.0, 2 / 10000, 0.0005, 0.123)] == [
        "–", "–", "0.0", "<0.1", "0.1", "12.3"]


def test_metrics_table_has_labels_and_units() -> None:
    from bayesncl.app.report.html import _scalars

    rows = _scalars({"semantic_consistency": 10.0, "active_dims": 8, "linear_probe_acc1": 43.333,
                     "linear_probe_protocol": "x" * 200, "retrieval": {"32": {}}, "custom": 0.123456})
    assert rows == [("Semantic consistency (SC)", "10.00", "%"), ("Active dims", "8", "count"),
                    ("Linear probe top-1 (LP@1, frozen h)", "43.33", "%"),
                    ("Linear probe protocol", "x" * 200, ""), ("custom", "0.1235", "")]
    # the gradient dynamics a table adds (the mechanism study's runs showed their raw keys, no unit)
    assert _scalars({"AF-GV": 0.81234, "dims": 251}) == [
        ("Activation frequency vs gradient variance, over dims", "0.812", "Spearman ρ"),
        ("Dims in those correlations (AF > 0, SC defined)", "251", "count")]


def test_correlations_by_hand() -> None:
    corr = dm.correlations(_feats()["features"], [0, 1, 3], n=2)
    assert corr[0][0] == (3, pytest.approx(-1.0))
    # dims 0 and 1: centred [2,1,0,-1,-1,-1] and [-7/6,-7/6,-7/6,-1/6,5/6,17/6]
    a = np.array([3, 2, 1, 0, 0, 0.0]) - 1
    b = np.array([0, 0, 0, 1, 2, 4.0]) - 7 / 6
    assert corr[0][1] == (1, pytest.approx(a @ b / np.linalg.norm(a) / np.linalg.norm(b)))
    assert dm.correlations(np.zeros((3, 2)), [1]) == {1: []}


def test_detail_by_hand() -> None:
    feats = _feats()
    counts = dm.class_fire_counts(np.abs(feats["features"]) > dm.EPS, feats["labels"], 3)
    assert counts[:, 1].tolist() == [0, 1, 2]
    d = dm.detail(feats, 1, counts, [])
    assert d.top == [5, 4, 3] and d.zeros == 3 and sum(d.hist[0]) == 3
    assert d.hist[1][0] == 0 and d.hist[1][-1] == 4  # dim 1 fires with 1, 2, 4: the axis is [0, 4]
    one = {**feats, "features": np.eye(6)[:, :1] * 0.25}  # a dim firing on one image: [0, 0.25], not v ± 0.5
    edges = dm.detail(one, 0, counts[:, :1], []).hist[1]
    assert (edges[0], edges[-1]) == (0, 0.25)
    assert [r for _, r in d.quantiles] == [3, 4, 5] and d.quantiles[0][0] == 0 and d.quantiles[-1][0] == 1
    assert d.classes == [(2, pytest.approx(2 / 3)), (1, pytest.approx(1 / 3))]
    d0 = dm.detail(feats, 0, counts, [])
    assert d0.closed == [4, 3] and d0.n_closed == 2  # largest pre-gate z first
    assert dm.images_used([d, d0]).tolist() == [0, 1, 2, 3, 4, 5]


def test_quantile_sample_spreads_and_dedups() -> None:
    values = np.arange(100.0)
    picks = dm.quantile_sample(values, np.arange(100), n=5)
    assert [r for _, r in picks] == [0, 25, 50, 74, 99]  # round(q * 99)
    assert dm.quantile_sample(values, np.array([7]), n=5) == [(0.0, 7)]
    assert dm.quantile_sample(values, np.array([], dtype=int)) == []


def test_svg_bars_scale_to_the_box() -> None:
    bars = dm.svg_bars([1, 2, 0], width=30, height=10)
    assert [b["h"] for b in bars] == [5.0, 10.0, 0.0] and [b["x"] for b in bars] == [0, 10, 20]


# ----------------------------------------------------------------------------- a real site
@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo-like run dir: a bayesncl and an ncl sub-run, 1 epoch of the tiny settings."""
    from bayesncl.app.train import pretrain
    from bayesncl.config import build_config

    root = tmp_path_factory.mktemp("demo")
    for m in ("bayesncl", "ncl"):
        pretrain(build_config(overrides=[*TINY, f"method.name={m}"]), root / m)
    return root


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for k, v in attrs:
            if k in ("href", "src") and v and not v.startswith(("data:", "#")):
                self.refs.append(v)


def _missing(page: Path, html: str) -> list[str]:
    """The links and images of ``html`` (page ``page``) that lead to no file; remote ones count."""
    parser = _Links()
    parser.feed(html)
    bad = []
    for ref in parser.refs:
        url = urlparse(ref)
        if url.scheme and url.scheme != "file":
            bad.append(ref)  # the site must work with no network
        elif not (Path(unquote(url.path)) if url.scheme else page.parent / unquote(url.path)).is_file():
            bad.append(ref)
    return bad


@pytest.mark.slow
def test_every_link_and_image_of_every_page_resolves(demo_dir: Path) -> None:
    from bayesncl.app.report.html import report_command

    index = report_command([demo_dir])
    assert index == demo_dir / "report" / "index.html"
    site = index.parent
    pages = sorted(site.rglob("*.html"))
    dims = sorted((site / "bayesncl").glob("dim-*.html"))
    assert len(dims) > 0 and (site / "ncl" / "dims.html").is_file() and (site / "curves.png").is_file()
    # several runs: their per-sample sparsity overlaid, and each run's own figure on its section
    assert (site / "sparsity.png").read_bytes().startswith(b"\x89PNG")
    assert 'src="sparsity.png"' in index.read_text() and (site / "ncl" / "figures" / "sparsity.png").is_file()
    for page in pages:
        text = page.read_text()
        assert _missing(page, text) == [], page
        assert "<script src" not in text and "@import" not in text  # nothing fetched from elsewhere
    index_html = index.read_text()
    assert 'id="comparison"' in index_html and index_html.count("<tr><td class=\"l\"><a href=\"#run-") == 2
    # the dimension index lists every active dim, each linked; gated runs get the gate column
    table = (site / "bayesncl" / "dims.html").read_text()
    assert len(re.findall(r'href="dim-\d+\.html"', table)) == len(dims)
    assert "gate open %" in table and "gate open %" not in (site / "ncl" / "dims.html").read_text()
    assert "Where the gate closed it" in dims[0].read_text() and "softly" not in dims[0].read_text()
    # thumbnails: one per shown test image, shared by both runs (same data)
    thumbs = list((site / "thumbs").rglob("*.png"))
    assert len(list((site / "thumbs").iterdir())) == 1 and 0 < len(thumbs) <= 60
    # a second report into the same folder replaces it; a foreign folder is refused
    assert report_command([demo_dir]) == index


@pytest.mark.slow
def test_a_log_with_every_column_still_draws_its_curves_in_the_report(tmp_path: Path, demo_dir: Path) -> None:
    """An ungated run's log.csv written before a run's columns were its own statistics (issue 45:
    every built-in column, the gate's empty) is read as before: the report redraws its curves, with
    the panels of what it logged, as it draws those of a log with its own columns."""
    import csv

    from bayesncl.app.report.curves import read_log, training_curves_figure
    from bayesncl.app.report.html import report_command
    from bayesncl.runs.logs import LOG_FIELDS, write_log

    run = shutil.copytree(demo_dir / "ncl", tmp_path / "ncl", ignore=shutil.ignore_patterns("report"))
    with (run / "log.csv").open() as f:
        reader = csv.DictReader(f)
        assert "kl" not in (reader.fieldnames or [])  # an ungated run's own columns
        rows = list(reader)
    titles = [ax.get_title() for ax in training_curves_figure({"ncl": read_log(run)}).axes]
    write_log(run, rows, fields=LOG_FIELDS)  # as the code before wrote it
    assert (run / "log.csv").read_text().splitlines()[0] == ",".join(LOG_FIELDS)
    assert [ax.get_title() for ax in training_curves_figure({"ncl": read_log(run)}).axes] == titles
    assert "KL(Bern(α) ‖ Bern(ρ)), sum over dims" not in titles
    site = report_command([run]).parent
    assert (site / "ncl" / "figures" / "training_curves.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_bad_inputs_are_one_line(tmp_path: Path, demo_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bayesncl.app.cli import main

    from ..conftest import error_line

    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "holds no run" in error_line(capsys)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert main(["report", str(demo_dir / "ncl"), "--out", str(tmp_path / "other")]) == 2
    assert "not an earlier report" in error_line(capsys)
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert error_line(capsys).startswith(ERROR) and capsys.readouterr().out == ""


def _chromium(url: str, user_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={user_dir}",
        "--enable-logging=stderr", "--v=0", "--window-size=1100,1400",
    ]
    return subprocess.run([CHROMIUM, *flags, *extra, url], capture_output=True, text=True, timeout=120)


@pytest.mark.integration
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (.ci/run installs Debian's chromium)")
def test_chromium_opens_the_pages_from_file(demo_dir: Path, tmp_path: Path) -> None:
    from PIL import Image

    from bayesncl.app.report.html import report_command

    index = report_command([demo_dir / "bayesncl"], out=tmp_path / "site")
    dim = sorted((tmp_path / "site" / "bayesncl").glob("dim-*.html"))[0]
    for n, page in enumerate([index, dim, index.parent / "bayesncl" / "dims.html"]):
        shot = tmp_path / f"shot{n}.png"
        done = _chromium(page.as_uri(), tmp_path / f"profile{n}", f"--screenshot={shot}")
        console = [ln for ln in done.stderr.splitlines() if ":CONSOLE" in ln]
        assert console == [], console  # no script error, no failed load logged
        pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
        assert pixels.std() > 5 and (pixels < 128).mean() > 0.001, page  # not blank
        dom = _chromium(page.as_uri(), tmp_path / f"profile{n}", "--dump-dom")
        assert "</table>" in dom.stdout or "<img" in dom.stdout
        assert _missing(page, dom.stdout) == [], page


def test_soft_gating_is_said_where_the_gated_features_are_shown(tmp_path: Path) -> None:
    """eval.use_soft_gating: the metrics table, evaluation.md, the dimension index and each page say the
    features were gated by α, and their gate-open rates are of the hard mask 1[α > 0.5] (``mask``),
    in evaluate's report and in a later ``bayesncl report`` (the features file's meta says how)."""
    import json

    from bayesncl.app.cli import main
    from bayesncl.app.report.html import report_command

    from ..conftest import tiny_checkpoint

    run = tmp_path / "run"
    run.mkdir()
    tiny_checkpoint(run / "last.pt", ["method.name=bayesncl"])  # its config: use_soft_gating false
    assert main(["evaluate", str(run), "--probe", "none", "--no-knn", "eval.use_soft_gating=true"]) == 0
    gating = json.loads((run / "evaluation.json").read_text())["gating"]  # one text, shown everywhere
    assert gating.startswith("soft, by α") and gating.endswith("the hard mask 1[α > 0.5]")
    assert f"Gated features: {gating}." in (run / "evaluation.md").read_text()
    said = escape(gating, quote=False)
    alpha = np.load(run / "features_test.npz")["alpha"]
    hard = 100 * (alpha > 0.5).mean(0)
    assert not np.allclose(hard, 100 * alpha.mean(0), atol=0.1)  # the mean α would read otherwise
    for site in (run / "report", report_command([run], out=tmp_path / "site").parent):
        assert "Gating of the features" in (site / "index.html").read_text()
        table = re.sub(r"\s+", " ", (site / "run" / "dims.html").read_text())
        dims = [int(k) for k in re.findall(r'href="dim-(\d+)\.html"', table)]
        shown = [float(v) for v in re.findall(r"<td>([\d.]+)</td></tr>", table)]
        assert shown == pytest.approx(hard[dims], abs=0.05) and f"; features gated {said}." in table
        page = re.sub(r"\s+", " ", (site / "run" / f"dim-{dims[0]}.html").read_text())
        assert f"Features gated {said}." in page and f"gate open on {hard[dims[0]]:.1f} %" in page


def test_an_older_soft_gated_files_mask_is_read_at_the_runs_threshold(tmp_path: Path) -> None:
    """A features file written under eval.use_soft_gating before its mask stayed 0/1 holds α there: it
    is read as 1[α > method.threshold] of the run (0.7 here), by the report and by reproduce's stored
    features, not at 0.5; with no run config known (bayesncl metrics FILE) at 0.5."""
    from bayesncl.app.report.html import load_run
    from bayesncl.config import build_config, dump_yaml
    from bayesncl.paper.variants import stored_features
    from bayesncl.runs.features import load_features, save_features

    alpha = np.array([[0.2, 0.6, 0.8], [0.65, 0.75, 0.4]] * 5, dtype=np.float32)  # (10, 3)
    at_07, at_05 = (alpha > 0.7).astype(np.float32), (alpha > 0.5).astype(np.float32)
    assert not np.array_equal(at_07, at_05)  # (0.6 and 0.65 lie between the two thresholds)
    run = tmp_path / "run"
    cfg = build_config(overrides=[*TINY, "method.name=bayesncl", "method.threshold=0.7"])
    run.mkdir()
    (run / "config.yaml").write_text(dump_yaml(cfg))
    rng = np.random.default_rng(0)
    meta = {"method": "bayesncl", "dataset": "synthetic", "soft_gating": True}
    for split in ("train", "test"):
        save_features(run / f"features_{split}.npz", features=rng.random((10, 3), dtype=np.float32),
                      labels=np.arange(10) % 2, h=rng.random((10, 4), dtype=np.float32), alpha=alpha,
                      mask=alpha, meta=meta)  # fmt: skip
    file = run / "features_test.npz"
    assert np.array_equal(load_features(file, threshold=0.7).mask, at_07)
    assert np.array_equal(load_features(file).mask, at_05)  # no run config known: the key's default
    assert np.array_equal(load_run(run, "run").feats["mask"], at_07)
    train, test = stored_features(run, cfg)
    assert np.array_equal(test.mask, at_07) and np.array_equal(train.mask, at_07)



def test_metrics_of_an_older_soft_gated_file_in_a_run_dir_reads_the_runs_threshold(tmp_path: Path) -> None:
    """`bayesncl metrics FILE` read an older soft-gated file's mask (which held α) at 0.5 where the report
    reads it at the run's method.threshold; in a run dir with config.yaml it now reads the run's (0.7),
    elsewhere (or beside a config.yaml that is no run's) still 0.5, as documented."""
    from bayesncl.app.evaluate import metrics_command
    from bayesncl.config import build_config, dump_yaml
    from bayesncl.metrics.background import background_metrics
    from bayesncl.runs.features import save_features

    labels, places = np.repeat(np.arange(4), 20), np.tile(np.repeat(np.arange(4), 5), 4)  # 4 x 4, 5 each
    z = np.zeros((80, 4), dtype=np.float32)  # dims: object (class 0), background (place 2), constant, dead
    z[:, 0], z[:, 1], z[:, 2] = labels == 0, 2.0 * (places == 2), 1.0
    alpha = np.random.default_rng(0).random(z.shape).astype(np.float32)
    run = tmp_path / "run"
    run.mkdir()
    cfg = build_config(overrides=[*TINY, "method.name=bayesncl", "method.threshold=0.7"])
    (run / "config.yaml").write_text(dump_yaml(cfg))
    meta = {"method": "bayesncl", "dataset": "synthetic", "soft_gating": True}
    file = run / "features_test.npz"
    save_features(file, features=z, labels=labels, places=places, z=z, mask=alpha, meta=meta)
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(file, tmp_path / "elsewhere" / "f.npz")

    def closure(threshold: float) -> tuple[float | None, float | None]:
        m = background_metrics(z, labels, places, z=z, mask=(alpha > threshold).astype(np.float32))
        return m["gate_closure_background"], m["gate_closure_object"]

    assert closure(0.7) != closure(0.5)
    out = metrics_command(file)
    assert (out["gate_closure_background"], out["gate_closure_object"]) == closure(0.7)
    (run / "eval-epoch-0003").mkdir()  # an earlier checkpoint's features (evaluate RUN/epoch-0003.pt): the
    shutil.copy(file, run / "eval-epoch-0003" / "features_test.npz")  # run's config.yaml is one level up
    out = metrics_command(run / "eval-epoch-0003" / "features_test.npz")
    assert (out["gate_closure_background"], out["gate_closure_object"]) == closure(0.7)
    (run / "notes").mkdir()  # any other folder of a run is no checkpoint's: not read as the run's
    shutil.copy(file, run / "notes" / "f.npz")
    out = metrics_command(run / "notes" / "f.npz")
    assert (out["gate_closure_background"], out["gate_closure_object"]) == closure(0.5)
    out = metrics_command(tmp_path / "elsewhere" / "f.npz")
    assert (out["gate_closure_background"], out["gate_closure_object"]) == closure(0.5)
    (tmp_path / "elsewhere" / "config.yaml").write_text("notes: [a user's file, not a run's config]\n")
    out = metrics_command(tmp_path / "elsewhere" / "f.npz")
    assert (out["gate_closure_background"], out["gate_closure_object"]) == closure(0.5)


# ----------------------------------------------------------------------------- the figure fixes
def test_suppressed_figure_shows_dims_the_gate_filters(tmp_path: Path) -> None:
    from bayesncl.app.report.figures import filtered_dims, suppressed_features_figure

    mask = np.ones((10, 4), dtype=np.float32)
    mask[:, 0] = 0  # closed on every image: filters nothing (a dead dim)
    mask[:5, 1] = 0  # closed on half: the most mixed
    mask[:2, 2] = 0  # closed on 2
    assert filtered_dims(mask, 5).tolist() == [1, 2]  # dim 3 always open, dim 0 always closed
    feats = _feats()
    feats["mask"][:, 2] = 0  # this features dict: dim 2 closed everywhere, dim 0 on rows 3 and 4
    feats["indices"] = np.arange(6)
    assert filtered_dims(feats["mask"], 5).tolist() == [0]
    images = np.arange(6, dtype=np.uint8).reshape(6, 1, 1, 1).repeat(8, 2).repeat(8, 3)
    import torch

    out = suppressed_features_figure(feats, torch.from_numpy(images), ["a", "b", "c"], tmp_path / "s.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
    feats["mask"][:] = 1
    with pytest.raises(ValueError, match="filters no dimension"):
        suppressed_features_figure(feats, torch.from_numpy(images), ["a", "b", "c"], tmp_path / "t.png")


def test_retrieval_rows_past_the_active_dims_are_marked() -> None:
    from bayesncl.app.report import format_retrieval

    row = {"P@1": 1.0, "P@3": 1.0, "P@5": 1.0, "P@10": 1.0, "mAP@10": 1.0}
    md = format_retrieval({"32": row, "64": row, "96": row}, active=40)
    lines = md.splitlines()
    assert [ln.split("|")[1].strip() for ln in lines[2:5]] == ["32", "64*", "96*"]
    assert "exceeds the 40 active dims" in lines[-1]
    assert "*" not in format_retrieval({"32": row}, active=40)
    assert "*" not in format_retrieval({"64": row})  # active unknown: nothing marked


def test_top_activation_rows_say_the_share_is_of_the_images_shown() -> None:
    from bayesncl.app.report.figures import _majority, run_label

    assert _majority(np.array([1, 1, 0, 1]), ["cat", "dog"]) == "dog: 3 of the\n4 shown"
    assert _majority(np.array([2, 0, 2, 0]), ["a", "b", "c"]) == "tie (2 classes): 2 each of the\n4 shown"
    assert run_label("bayesncl", Path("runs/demo-1/bayesncl")) == "bayesncl, run demo-1/bayesncl"
    assert run_label("ncl", Path("store/variants/0123456789ab"), 1) == "ncl seed 1, run variants/0123456789ab"


# ----------------------------------------------------------------------------- while it trains
def test_heldout_indices_spread_over_the_split() -> None:
    from bayesncl.app.heldout import heldout_indices

    assert heldout_indices(10, 4).tolist() == [0, 3, 6, 9]
    assert heldout_indices(5, 2000).tolist() == [0, 1, 2, 3, 4]


def test_heldout_measure_leaves_rng_batchnorm_and_modes_as_they_were() -> None:
    """The monitor runs between epochs: a forward that draws random numbers and would update
    BatchNorm in train mode changes neither torch's random stream nor the running statistics, and
    every submodule gets its own train/eval flag back."""
    from types import SimpleNamespace

    import torch
    from torch import nn

    from bayesncl.app.heldout import HeldOut

    class Drawing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn, self.head = nn.BatchNorm1d(3), nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> SimpleNamespace:
            z = torch.relu(self.head(self.bn(x.flatten(1))) + torch.rand(len(x), 3))
            return SimpleNamespace(z_tilde=z, mask=None)

    torch.manual_seed(0)
    model = Drawing().train()
    model.head.eval()  # a submodule the loop keeps in eval mode
    x = torch.randn(6, 3, 1, 1) * 5 + 2
    stats = (model.bn.running_mean.clone(), model.bn.running_var.clone())
    rng = torch.get_rng_state()
    row = HeldOut(x, torch.tensor([0, 0, 1, 1, 2, 2]), batch_size=4).measure(model, torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(model.bn.running_mean, stats[0]) and torch.equal(model.bn.running_var, stats[1])
    assert model.training and model.bn.training and not model.head.training
    assert "heldout_gate_open" not in row and 0 <= row["heldout_active_dims"] <= 3  # no gate: no column


@pytest.mark.slow
def test_heldout_columns_match_the_final_evaluation_and_change_no_weight(
    demo_dir: Path, tmp_path: Path
) -> None:
    """With at least as many held-out images as the test split has, the last epoch's held-out SC,
    H_sum and active dims are the final evaluation's; with the monitor off, the weights are the same."""
    import torch

    from bayesncl.app.report.curves import read_log
    from bayesncl.app.train import pretrain
    from bayesncl.config import build_config

    run = demo_dir / "bayesncl"
    last = read_log(run)[-1]
    final = __import__("json").loads((run / "metrics.json").read_text())
    assert last["heldout_sc"] == pytest.approx(final["semantic_consistency"], abs=1e-3)
    assert last["heldout_h_sum"] == pytest.approx(final["semantic_entropy_sum"], abs=1e-5)
    assert last["heldout_active_dims"] == final["active_dims"]
    assert last["heldout_gate_open"] == pytest.approx(final["gate_open_rate"], abs=1e-5)
    assert last["heldout_gate_mean_alpha"] == pytest.approx(final["gate_mean_alpha"], abs=1e-5)
    assert last["heldout_effective_rank"] == pytest.approx(final["effective_rank"], abs=1e-3)
    off = tmp_path / "off"
    pretrain(build_config(overrides=[*TINY, "method.name=bayesncl", "train.monitor_samples=0"]), off,
             evaluate=False)
    assert all(np.isnan(r["heldout_sc"]) for r in read_log(off))
    a = torch.load(run / "last.pt", weights_only=True)["state_dict"]
    b = torch.load(off / "last.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_missing_logger_package_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import builtins

    from bayesncl.app.cli import main

    from ..conftest import error_line

    real = builtins.__import__

    def no_wandb(name: str, *args: object, **kwargs: object) -> object:
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    run = tmp_path / "r"
    assert main(["pretrain", "--run-dir", str(run), *TINY, "train.loggers=csv,wandb"]) == 2
    assert "pip install 'bayesncl[wandb]'" in error_line(capsys)
    assert not run.exists()  # refused before the run dir is touched


def _scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.mark.slow
def test_tensorboard_gets_the_log_rows_and_resume_continues_it(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from bayesncl.app.report.curves import read_log
    from bayesncl.app.train import pretrain
    from bayesncl.config import build_config

    run = tmp_path / "tb"
    cfg = build_config(overrides=[*TINY, "method.name=bayesncl", "train.loggers=[csv,tensorboard]"])
    pretrain(cfg, run, evaluate=False)
    cfg.train.epochs = 2
    pretrain(cfg, run, resume=True)
    rows = read_log(run)
    for col in ("info_nce", "heldout_sc", "gate_open"):
        got = _scalars(run / "tensorboard", f"train/{col}")
        assert got == [(r["epoch"], pytest.approx(r[col])) for r in rows], col
    assert _scalars(run / "tensorboard", "eval/semantic_consistency")[0][0] == 2
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    assert "figures/training_curves" in acc.Tags()["images"]


@pytest.mark.slow
def test_wandb_gets_the_log_rows_and_resume_keeps_its_run_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in ``wandb`` module records what the logger sends (the real one, offline, writes
    protobuf files only ``wandb sync`` reads)."""
    import sys
    import types

    from bayesncl.app.report.curves import read_log
    from bayesncl.app.train import pretrain
    from bayesncl.config import build_config

    calls: list[tuple[str, object]] = []

    class _Run:
        def log(self, values: dict[str, object], step: int) -> None:
            calls.append(("log", (step, values)))

        def finish(self) -> None:
            calls.append(("finish", None))

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls.append(("init", kw)) or _Run()  # type: ignore[attr-defined]
    fake.Image = lambda path: ("image", Path(path).name)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run = tmp_path / "wb"
    cfg = build_config(overrides=[*TINY, "method.name=bayesncl", "train.loggers=csv,wandb"])
    pretrain(cfg, run, evaluate=False)
    cfg.train.epochs = 2
    pretrain(cfg, run, resume=True)
    inits = [kw for what, kw in calls if what == "init"]
    assert len(inits) == 2 and inits[0]["id"] == inits[1]["id"] == (run / "wandb-id.txt").read_text().strip()
    assert inits[0]["mode"] == "offline" and inits[1]["resume"] == "allow"
    logs = [v for what, v in calls if what == "log"]
    rows = read_log(run)
    epoch_logs = [(step, values) for step, values in logs if "train/info_nce" in values]
    expected = [(r["epoch"], pytest.approx(r["info_nce"])) for r in rows]
    assert [(s, v["train/info_nce"]) for s, v in epoch_logs] == expected
    final_step, final = logs[-1]
    assert final_step == 2 and final["figures/training_curves"] == ("image", "training_curves.png")
    assert final["eval/semantic_consistency"] == pytest.approx(read_log(run)[-1]["heldout_sc"], abs=1e-3)


def test_report_and_dynamics_read_a_moved_runs_data_under_data_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run records the data.root it trained with. After the data moved, a table's report (reproduce,
    mechanism, demo) read the old root and warned "no HTML report: ... not found in <old root> ... or
    set data.root" though the command had set it; `bayesncl report RUN` and `bayesncl dynamics RUN` gave
    that advice but took no key=value. The table's report reads the command's root (the one mechanism
    every measure uses), and both commands take data.root=DIR, and only that."""
    import json

    from bayesncl.app.cli import main
    from bayesncl.config import build_config, dump_yaml
    from bayesncl.data import clear_cache
    from bayesncl.paper import variants

    from ..conftest import error_line, expect, fmnist_folder, tiny_checkpoint

    clear_cache()
    gone, here, table = tmp_path / "gone", tmp_path / "here", tmp_path / "table"
    data = ["data.name=fashion-mnist-bg", "data.train_subset=64", "data.test_subset=40"]
    run = table / "ncl"
    run.mkdir(parents=True)
    tiny_checkpoint(run / "last.pt", [*data, f"data.root={gone}"])  # trained where the data lay then
    shutil.copy(run / "last.pt", run / "epoch-0001.pt")
    (run / "config.yaml").write_text(dump_yaml(build_config(overrides=[*TINY, *data, f"data.root={gone}"])))
    shutil.move(fmnist_folder(gone), here)
    now = build_config(overrides=[*TINY, *data, f"data.root={here}"])  # the command's config for it
    variants.write_table(table, "t", {}, "", "h", {}, cfg=now)  # (no log.csv: no curves; the folder's runs)
    out = capsys.readouterr().out
    assert "warning" not in out and f"HTML report: {table / 'report' / 'index.html'}" in out
    assert (table / "report" / "index.html").is_file() and not gone.exists()
    assert main(["report", str(run), "--out", str(tmp_path / "site")]) == 2  # the old root: D1's advice
    assert error_line(capsys).startswith(f"{ERROR}Fashion-MNIST not found in {gone} ")
    assert main(["report", str(run), "--out", str(tmp_path / "site"), f"data.root={here}"]) == 0  # taken
    assert (tmp_path / "site" / "index.html").is_file()
    assert main(["dynamics", str(run), "--samples", "32", f"data.root={here}"]) == 0
    assert [r["epoch"] for r in json.loads((run / "dynamics.json").read_text())["rows"]] == [1]
    for command in (["report", str(run)], ["dynamics", str(run)]):
        assert main([*command, f"data.root={here}", "method.rho=0.5"]) == 2
        line = error_line(capsys)
        assert line == (
            f"{ERROR}method.rho: {command[0]} takes only data.root=DIR (where the run's data lies now, if it "
            "moved since the run trained); the run's own config sets the rest"
        )
        if command[0] == "report":
            expect("M6", line, tmp_path)
    assert main(["report", f"data.root={here}"]) == 2
    assert "give one or more RUN_DIR" in error_line(capsys)
    clear_cache()


def test_report_takes_run_dirs_named_with_an_equals_sign_and_names_packed_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Since `report` takes data.root=DIR among its RUN_DIRs, a run dir named like a sweep's
    (``rho=0.3``, ``runs/rho=0.3``) was read as a key=value and refused ("rho: report takes only
    data.root=DIR"); a path that exists, or whose part before ``=`` holds a ``/``, is a run dir again.
    A packed run (a store's results without checkpoint or features) was "no run to report on", which
    read as an error in the folder; it is named as packed, with where its report can be made."""
    from bayesncl.app.cli import main

    from ..conftest import error_line, expect, tiny_checkpoint

    run = tmp_path / "rho=0.3"
    run.mkdir()
    tiny_checkpoint(run / "last.pt", [])
    monkeypatch.chdir(tmp_path)
    assert main(["report", "rho=0.3", "--out", "site"]) == 0  # a relative path that exists
    assert capsys.readouterr().out == f"report: {Path('site') / 'index.html'}\n"
    assert "rho=0.3" in (tmp_path / "site" / "index.html").read_text()
    assert main(["report", str(tmp_path / "gone=1")]) == 2  # a path that does not exist: said as one
    assert error_line(capsys) == f"{ERROR}{tmp_path / 'gone=1'}: no such run dir"
    assert main(["report", "rho=0.3", "root=x"]) == 2  # a key=value still: refused as before (M6)
    assert error_line(capsys).startswith(f"{ERROR}root: report takes only data.root=DIR")
    store = tmp_path / "store"
    packed = store / "0123456789ab"
    packed.mkdir(parents=True)
    for name in ("metrics.json", "log.csv", "config.yaml"):
        (packed / name).write_text("{}" if name == "metrics.json" else "")
    advice = (
        "nothing to report on; a report needs each run's last.pt or features_test.npz: `bayesncl report "
        "RUN_DIR` makes it where the runs were trained (the store that holds their checkpoints)"
    )
    assert main(["report", str(packed)]) == 2
    assert (line := error_line(capsys)) == (
        f"{ERROR}{packed} is a packed run (its stored results, metrics.json and log.csv, without a "
        f"checkpoint or features), {advice}"
    )
    expect("M7", line, tmp_path)
    assert main(["report", str(store)]) == 2
    assert error_line(capsys) == (
        f"{ERROR}{store} holds only packed runs (0123456789ab: stored results without a checkpoint or "
        f"features), {advice}"
    )
    assert sorted(p.name for p in packed.iterdir()) == ["config.yaml", "log.csv", "metrics.json"]
