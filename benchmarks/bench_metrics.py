"""Benchmark of the metrics suite (docs/metrics.md, "Benchmarks").

One run prints:

1. SC + the three semantic entropies (one class-aggregation product) on N x D features with C
   classes, the time of one (C x N) @ (N x D) matmul on the same data, and their ratio (target
   <= 8);
2. the naive per-dimension Python loops written like the authors' evaluation code (timed on
   ``--loop-dims`` dims and extrapolated to D when that is fewer than D, which is said), the
   speed-up, and the largest per-dimension difference between the two;
3. retrieval with feature selection on a large set (default 50,000 x 2,048), in row chunks, run
   in a child process so that its peak RSS (``ru_maxrss``) is its own: time and peak RSS
   (target <= 2 GiB);
4. what ``bayesncl metrics FEATURES.npz --retrieval-dims K`` computes on the same set (every metric
   of ``compute_all``, our retrieval and NCL's own map), from an uncompressed ``.npz`` loaded as
   the command loads it, in a child process: time and peak RSS (target <= 2 GiB; issue 46).
   ``--skip-metrics-path`` leaves it out (NCL's map ranks N x N float64 distances: minutes).

Usage: ``python benchmarks/bench_metrics.py [--quick] [--loop-dims 256] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from bayesncl.metrics.semantic import SemanticStats, semantic_metrics

EPS = 1e-5


def make_features(n: int, d: int, classes: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse non-negative unit-norm float32 features with class structure, built in place."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    bias = torch.randn(classes, d, generator=g) * 0.5 - 1.2  # per-class preferred dims
    feats = torch.empty(n, d)
    step = 4096
    for i in range(0, n, step):
        block = feats[i : i + step]
        torch.randn(block.shape, generator=g, out=block)
        block += bias[labels[i : i + step]]
        block.clamp_(min=0)
        block /= torch.linalg.vector_norm(block, dim=1, keepdim=True).clamp_min(1e-12)
    return feats, labels


def best_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


# ---------------------------------------------------------------------------------------------
# the authors' loops (solo/methods/bayesncl_eval_helper_functions.py), restricted to `dims`
# ---------------------------------------------------------------------------------------------


def loop_sc(features: torch.Tensor, labels: torch.Tensor, dims) -> list[float]:
    active = features.abs().sum(0) > 0
    features = F.normalize(features[:, active], dim=1)
    out = []
    for i in dims:
        mask = features.abs()[:, i] > EPS  # the authors take |F| of the whole matrix per dim
        sel = labels[mask]
        if sel.numel() == 0:
            out.append(float("nan"))
            continue
        dist = sel.bincount()
        dist = dist / dist.sum()
        out.append(dist.max().item())
    return out


def loop_entropy(features: torch.Tensor, labels: torch.Tensor, dims, kind: str) -> list[float]:
    features = features[:, features.abs().sum(0) > EPS]
    _, inv = torch.unique(labels, return_inverse=True)
    sizes = torch.bincount(inv).float() + EPS
    out = []
    for i in dims:
        col = features[:, i].abs()
        if kind == "sum":
            w = torch.bincount(inv, weights=col)
        elif kind == "mean":
            w = torch.bincount(inv, weights=col) / sizes
        else:
            w = torch.bincount(inv, weights=(col > EPS).float())
        total = w.sum()
        if total < EPS:
            out.append(float("nan"))
            continue
        p = w / total
        p = p[p > EPS]
        out.append(float(-(p * torch.log(p)).sum()))
    return out


def loop_all(features, labels, dims) -> dict[str, list[float]]:
    return {
        "sc": loop_sc(features, labels, dims),
        "sum": loop_entropy(features, labels, dims, "sum"),
        "mean": loop_entropy(features, labels, dims, "mean"),
        "freq": loop_entropy(features, labels, dims, "freq"),
    }


# ---------------------------------------------------------------------------------------------
# retrieval child process
# ---------------------------------------------------------------------------------------------


def retrieval_child(n: int, d: int, classes: int, dims: list[int], chunk: int | None) -> None:
    from bayesncl.metrics.retrieval import retrieval_metrics

    feats, labels = make_features(n, d, classes, seed=1)
    rss_data = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    res = retrieval_metrics(feats, labels, dims=dims, chunk_size=chunk)
    elapsed = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(
        json.dumps({"seconds": elapsed, "peak_rss_kib": rss, "rss_after_data_kib": rss_data, "result": res})
    )


def metrics_path_child(path: str, dims: list[int]) -> None:
    """``bayesncl metrics PATH --retrieval-dims DIMS`` as the command runs it (load_features, then
    compute_all), printing its time and this process's peak RSS as one JSON line."""
    from bayesncl.metrics.registry import compute_all
    from bayesncl.runs.features import load_features

    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    fs = load_features(path)
    out = compute_all(fs.features, fs.labels, dims)
    elapsed = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": elapsed, "peak_rss_kib": rss, "rss_after_imports_kib": rss_start,
                      "ncl_map": out.get("ncl_map")}))


def run_metrics_path(n: int, d: int, classes: int, dims: list[int]) -> dict:
    """Write the features as an uncompressed .npz in a temporary folder, run
    :func:`metrics_path_child` on it in a child process, return its JSON."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "features.npz")
        feats, labels = make_features(n, d, classes, seed=1)
        np.savez(path, features=feats.numpy(), labels=labels.numpy())
        del feats, labels
        cmd = [sys.executable, __file__, "--_metrics-child", path, ",".join(map(str, dims))]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_retrieval(n: int, d: int, classes: int, dims: list[int], chunk: int | None) -> dict:
    cmd = [sys.executable, __file__, "--_retrieval-child", f"{n},{d},{classes}", ",".join(map(str, dims))]
    if chunk:
        cmd += ["--chunk", str(chunk)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    ap.add_argument("--loop-dims", type=int, default=256, help="dims timed for the loop (0: all D)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--chunk", type=int, default=None, help="retrieval query chunk (default: auto)")
    ap.add_argument("--retrieval-dims", default="64,256")
    ap.add_argument("--skip-metrics-path", action="store_true", help="leave out part 4 (bayesncl metrics)")
    ap.add_argument("--_retrieval-child", dest="child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_metrics-child", dest="metrics_child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("child_dims", nargs="?", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.metrics_child:
        metrics_path_child(args.metrics_child, [int(k) for k in args.child_dims.split(",")])
        return
    if args.child:
        n, d, c = (int(v) for v in args.child.split(","))
        retrieval_child(n, d, c, [int(k) for k in args.child_dims.split(",")], args.chunk)
        return

    n, d, c = (2_000, 512, 20) if args.quick else (10_000, 2_048, 100)
    rn, rd = (5_000, 512) if args.quick else (50_000, 2_048)
    cpu = platform.processor() or platform.machine()
    print(
        f"# bench_metrics  {time.strftime('%Y-%m-%d')}  torch {torch.__version__}  "
        f"threads {torch.get_num_threads()}  cpus {os.cpu_count()}  {cpu}"
    )

    feats, labels = make_features(n, d, c)
    sparsity = 1 - float((feats > EPS).float().mean())
    print(
        f"\n## SC + 3 semantic entropies: N={n:,} D={d:,} C={c} (float32, unit rows, sparsity {sparsity:.2f})"
    )
    onehot = torch.zeros(c, n)
    onehot[labels, torch.arange(n)] = 1
    t_mm = best_time(lambda: torch.mm(onehot, feats), args.repeats)
    t_vec = best_time(lambda: semantic_metrics(feats, labels), args.repeats)
    print(f"one (C x N) @ (N x D) matmul : {t_mm * 1e3:9.1f} ms")
    print(f"SC + H_sum + H_mean + H_freq  : {t_vec * 1e3:9.1f} ms")
    print(f"ratio                         : {t_vec / t_mm:9.2f}   (target <= 8)")

    loop_dims = d if args.loop_dims <= 0 else min(args.loop_dims, d)
    dims = list(range(loop_dims))
    t0 = time.perf_counter()
    ref = loop_all(feats, labels, dims)
    t_loop_part = time.perf_counter() - t0
    t_loop = t_loop_part * d / loop_dims
    how = (
        "measured on all dims"
        if loop_dims == d
        else f"measured on {loop_dims} of {d} dims, extrapolated x{d / loop_dims:g}"
    )
    print(f"naive per-dim loops (authors) : {t_loop:9.2f} s   ({how})")
    print(f"speed-up                      : {t_loop / t_vec:9.0f} x")

    stats = SemanticStats.from_features(feats, labels)
    ours = {
        "sc": stats.sc_per_dim()[:loop_dims],
        **{k: v[:loop_dims] for k, v in stats.entropies_per_dim().items()},
    }
    diffs = {k: float(np.nanmax(np.abs(np.asarray(ref[k]) - ours[k]))) for k in ref}
    print("max |loop - vectorised| per dim: " + "  ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
    full = semantic_metrics(feats, labels)
    print("values: " + "  ".join(f"{k} {v:.4f}" for k, v in full.items()))
    if loop_dims == d:
        loop_means = {k: float(np.nanmean(v)) for k, v in ref.items()}
        loop_means["sc"] *= 100
        print("loop means: " + "  ".join(f"{k} {v:.4f}" for k, v in loop_means.items()))

    rdims = [int(k) for k in args.retrieval_dims.split(",") if int(k) <= rd]
    print(f"\n## retrieval with feature selection: N={rn:,} D={rd:,} K={rdims} (child process, chunked)")
    res = run_retrieval(rn, rd, c, rdims, args.chunk)
    gib = res["peak_rss_kib"] / 2**20
    print(f"time (all K)                  : {res['seconds']:9.1f} s")
    print(
        f"peak RSS (whole child)        : {gib:9.2f} GiB   (target <= 2 GiB; "
        f"after building the {rn * rd * 4 / 2**30:.2f} GiB float32 features: "
        f"{res['rss_after_data_kib'] / 2**20:.2f} GiB)"
    )
    dense_gib = rn * rn * 4 / 2**30
    print(f"(a dense N x N float32 similarity matrix would take {dense_gib:.1f} GiB)")
    for k, row in res["result"].items():
        print(f"K={k:>4}: " + "  ".join(f"{m} {v:.2f}" for m, v in row.items()))

    if args.skip_metrics_path:
        return
    ks = ",".join(map(str, rdims))
    print(f"\n## bayesncl metrics FEATURES.npz --retrieval-dims {ks}: N={rn:,} D={rd:,} "
          "(child process: load + every metric + retrieval + NCL's map)")
    res = run_metrics_path(rn, rd, c, rdims)
    print(f"time                          : {res['seconds']:9.1f} s")
    print(
        f"peak RSS (whole child)        : {res['peak_rss_kib'] / 2**20:9.2f} GiB   (target <= 2 GiB; "
        f"after the imports: {res['rss_after_imports_kib'] / 2**20:.2f} GiB; "
        f"input {rn * rd * 4 / 2**30:.2f} GiB)"
    )
    print("NCL map: " + "  ".join(f"K={k} {v:.2f}" for k, v in (res["ncl_map"] or {}).items()))


if __name__ == "__main__":
    main()
