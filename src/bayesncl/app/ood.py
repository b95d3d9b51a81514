"""Out-of-distribution transfer (the NCL paper's ImageNet-C / -Sketch / Stylized-ImageNet linear
accuracy): the fast linear probe fitted once on the clean train split's frozen h, scored on a tensor
dataset's test split corrupted (:mod:`bayesncl.data.corruptions`) or on the released sets under an
image folder's ``data.root`` (:mod:`bayesncl.data.shifted`). Protocol, folder layout and result keys
(accuracies in percent): docs/metrics.md, "Out-of-distribution transfer".
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bayesncl.config import Config
from bayesncl.data.corruptions import CORRUPTIONS, SEVERITIES, check_corruptions, corrupted_test_split
from bayesncl.data.shifted import class_folder_set, imagenet_c_sets, shifted_eval_loader

__all__ = ["ood_evaluate", "ood_markdown"]

PROTOCOL = "fast linear probe fitted on clean train h (seed {seed}), scored on each shifted test set"


def _accuracy(model: Any, probe: Any, loader: Any, device: torch.device) -> float:
    from bayesncl.app.evaluate import extract_features

    out = extract_features(model, loader, device, keys=("h",))
    return float(probe.accuracy(out["h"], out["labels"])["acc1"])


def _folder_sets(cfg: Config, corruptions: Sequence[str] | None, severities: Sequence[int]) -> dict[str, Any]:
    """The released sets under ``data.root`` (docs/metrics.md) that exist: ``{"c": {(name, sev): set},
    "sketch": set, "stylized": set}``."""
    from bayesncl.data import dataset_info

    root = Path(os.path.expanduser(str(cfg.data.root or ".")))
    names = dataset_info(cfg.data).class_names
    found: dict[str, Any] = {}
    if (root / "imagenet-c").is_dir():
        found["c"] = imagenet_c_sets(root / "imagenet-c", names, corruptions, severities)
    for key, folder in (("sketch", "imagenet-sketch"), ("stylized", "stylized-imagenet")):
        if (root / folder).is_dir():
            found[key] = class_folder_set(root / folder, names, folder)
    return found


def ood_evaluate(
    model: Any, cfg: Config, *, corruptions: Sequence[str] | None = None,
    severities: Sequence[int] = SEVERITIES,
    seed: int = 0, cache: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """The OOD transfer of ``model`` (docs/metrics.md) on ``cfg``'s data. ``corruptions``: default the 15
    ImageNet-C benchmark ones (for a folder: every corruption folder there). ``seed``: the probe's
    and the corruptions'. ``cache``: the corrupted copies' folder. Raises DataError (one line, before
    any work) for an unknown corruption or a severity outside 1-5, or a folder dataset without any
    shifted set; EvalError for unusable features."""
    from bayesncl.app.evaluate import extract_split
    from bayesncl.data.sources import DataError, load_split
    from bayesncl.metrics.shift_probe import fit_probe

    names, sevs = check_corruptions(corruptions or CORRUPTIONS, severities)
    folder = load_split(cfg.data, "test").images is None
    sets = _folder_sets(cfg, corruptions, sevs) if folder else {}
    if folder and not sets:
        raise DataError(
            f"no shifted test set under {cfg.data.root}: expected imagenet-c/<corruption>/<severity>/"
            "<class>/, imagenet-sketch/<class>/ or stylized-imagenet/<class>/ there"
        )
    device = next(model.parameters()).device
    train = extract_split(model, cfg, "train", device, keys=("h",))
    test = extract_split(model, cfg, "test", device, keys=("h",))
    probe = fit_probe(train["h"], train["labels"], seed=seed)
    result: dict[str, Any] = {"clean_acc1": probe.accuracy(test["h"], test["labels"])["acc1"]}
    per: dict[str, dict[str, float]] = {}
    bs = cfg.eval.batch_size
    if folder:
        for (n, s), fs in sets.get("c", {}).items():
            loader = shifted_eval_loader(fs, None, cfg.data, bs, device)
            per.setdefault(n, {})[str(s)] = _accuracy(model, probe, loader, device)
        for key in ("sketch", "stylized"):
            if key in sets:
                loader = shifted_eval_loader(sets[key], None, cfg.data, bs, device)
                result[f"{key}_acc1"] = _accuracy(model, probe, loader, device)
    else:
        for n in names:
            for s in sevs:
                images, labels = corrupted_test_split(cfg.data, n, s, seed=seed, cache=cache)
                loader = shifted_eval_loader(images, labels, cfg.data, bs, device)
                per.setdefault(n, {})[str(s)] = _accuracy(model, probe, loader, device)
    if per:
        result["corruptions"] = per
        levels = sorted({s for row in per.values() for s in row}, key=int)
        result["severity_mean"] = {
            s: float(np.mean([row[s] for row in per.values() if s in row])) for s in levels
        }
        result["corruption_mean"] = float(np.mean([v for row in per.values() for v in row.values()]))
    result["protocol"] = PROTOCOL.format(seed=seed)
    return result


def ood_markdown(result: dict[str, Any]) -> str:
    """The per-corruption table (rows: corruptions, columns: severities, mean) of :func:`ood_evaluate`."""
    per = result.get("corruptions", {})
    lines = [f"Clean test Acc@1: {result['clean_acc1']:.2f} %"]
    if per:
        levels = list(result["severity_mean"])
        lines += ["", "| corruption | " + " | ".join(f"s{s}" for s in levels) + " | mean |",
                  "|---|" + "---:|" * (len(levels) + 1)]
        for n, row in per.items():
            cells = [f"{row[s]:.2f}" if s in row else "–" for s in levels]
            lines.append(f"| {n} | " + " | ".join(cells) + f" | {np.mean(list(row.values())):.2f} |")
        means = [f"{result['severity_mean'][s]:.2f}" for s in levels]
        lines.append("| **mean** | " + " | ".join(means) + f" | {result['corruption_mean']:.2f} |")
    for key, label in (("sketch_acc1", "ImageNet-Sketch"), ("stylized_acc1", "Stylized-ImageNet")):
        if key in result:
            lines.append(f"\n{label} Acc@1: {result[key]:.2f} %")
    return "\n".join(lines)


def parse_list(value: str | None, what: str) -> list[str] | None:
    """A comma-separated option value as a list (None when not given); ``all`` for corruptions is
    the 15 benchmark ones plus the package's 4 validation ones."""
    from bayesncl.data.corruptions import EXTRA_CORRUPTIONS

    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    if what == "corruptions" and items == ["all"]:
        return [*CORRUPTIONS, *EXTRA_CORRUPTIONS]
    return items


def parse_severities(value: str | None) -> list[int]:
    """``--severities 1,3,5`` as integers (default 1-5). Raises DataError for a non-integer."""
    from bayesncl.data.sources import DataError

    out = []
    for v in parse_list(value, "severities") or [str(s) for s in SEVERITIES]:
        try:
            out.append(int(v))
        except ValueError:
            raise DataError(f"corruption severity {v!r}: expected an integer from 1 to 5") from None
    return out


def ood_command(
    source: str | Path, *, corruptions: Sequence[str] | None = None, severities: Sequence[int] = SEVERITIES,
    seed: int = 0, cache: str | os.PathLike[str] | None = None, overrides: list[str] | None = None,
) -> dict[str, Any]:
    """``bayesncl ood``: :func:`ood_evaluate` of a trained run or checkpoint, written as ``ood.json``,
    ``ood.md`` and ``ood.png`` (accuracy against severity) beside it. The corruption names and
    severities are checked before anything is loaded or written (DataError, one line)."""
    from bayesncl.app.evaluate import load_trained
    from bayesncl.app.report import write_results

    check_corruptions(corruptions or CORRUPTIONS, severities)
    model, cfg, out_dir = load_trained(source, overrides=overrides, command="ood")
    result = ood_evaluate(model, cfg, corruptions=corruptions, severities=severities, seed=seed, cache=cache)
    result["method"] = cfg.method.name
    md = ood_markdown(result)
    header = f"Out-of-distribution transfer of {source} ({PROTOCOL.format(seed=seed)})."
    write_results(out_dir, "ood", result, md, header=header)
    if "severity_mean" in result:
        write_ood_figure({cfg.method.name: result}, out_dir / "ood.png")
    print(md)
    return result


def write_ood_figure(results: dict[str, dict[str, Any]], path: Path) -> Path:
    """Mean accuracy over corruptions against severity (0 = clean), one line per run of ``results``."""
    from bayesncl.app.report.plots import write_error_bar_figure

    series = []
    for label, r in results.items():
        pts = [(0.0, r["clean_acc1"], None)] + [(float(s), v, None) for s, v in r["severity_mean"].items()]
        series.append((label, pts, ()))
    panel = ("mean over corruptions", "severity (0 = clean)", "linear probe Acc@1 (%)", "linear", series)
    return write_error_bar_figure([panel], path, "Out-of-distribution transfer", 1)
