"""The main job: NCL vs BayesNCL on Fashion-MNIST with the same budget, one side-by-side table.

Budget (2 CPU cores, 212 s in all on idle AVX512-BF16 cores at the demo's ``train.precision=auto``,
measured 2026-12-04; the recipe's fp32 and 20,000 images took 474 s): ResNet-18 with the ImageNet
stem on 28 px gray images (the CIFAR stem would be ~20× slower), a class-stratified 12,000-image
train subset (the recipe's 20,000 with ``data.train_subset=20000``), 3 epochs, batch 256. The choice
of ρ and λ for this scale is explained in docs/decisions.md ("Demo scale").
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bayesncl.app.report import format_table
from bayesncl.config import (
    Config,
    ConfigError,
    build_config,
    inert_method_keys,
    parse_overrides,
    refuse_fixed_keys,
    valid_keys,
    warn_inert_keys,
)
from bayesncl.paper import variants

DEMO_CONFIG = Path(__file__).parents[1] / "configs" / "fashion-mnist-demo.yaml"
DEMO_METHODS = ("ncl", "bayesncl")
QUICK_OVERRIDES = [
    "data.train_subset=2000", "data.test_subset=1000", "train.epochs=1", "train.batch_size=128",
]
#: The demo trains at the CPU's fast precision on 12,000 of the recipe's 20,000 images (issue 46: under
#: 4 minutes on 2 idle AVX512-BF16 cores; at 20,000 images bf16 took 304 s): ``auto`` is bf16 autocast +
#: channels-last where the CPU computes bf16 natively (AVX512-BF16 or AMX), fp32 elsewhere. The recipe
#: stays as it was, the base of ``reproduce --dataset fashion-mnist`` and ``mechanism``, whose stored
#: runs keep their names; ``bayesncl demo train.precision=fp32 data.train_subset=20000`` is the former
#: fp32 demo, digit for digit.
DEMO_OVERRIDES = ["train.precision=auto", "data.train_subset=12000"]


def demo_configs(overrides: list[str], quick: bool = False) -> dict[str, Config]:
    """One resolved config per method, identical except for ``method.name``'s preset and the
    overrides of method keys that have no effect on that method (:func:`inert_method_keys`): those
    are meant for the other run (``method.rho`` for bayesncl), so this one keeps the recipe's values
    and no warning names it. A key that has no effect on either run is warned about once.

    Raises ConfigError for a bad override, or one of ``method.name``, which the demo sets itself."""
    refuse_fixed_keys(overrides, ("method.name",), f"the demo's two runs ({', '.join(DEMO_METHODS)})")
    extra = DEMO_OVERRIDES + (QUICK_OVERRIDES if quick else []) + list(overrides)
    keys = list(parse_overrides(list(overrides)))
    configs, inert = {}, {}
    for m in DEMO_METHODS:
        cfg = build_config(DEMO_CONFIG, [*extra, f"method.name={m}"], warn_inert=False)
        inert[m] = inert_method_keys(cfg.method, keys)
        if inert[m]:  # method.gate and method.topk decide what is inert, and are never inert themselves
            kept = [o for o in extra if o.split("=", 1)[0].strip() not in inert[m]]
            cfg = build_config(DEMO_CONFIG, [*kept, f"method.name={m}"], warn_inert=False)
        configs[m] = cfg
    useless = [k for k in keys if all(k in i for i in inert.values())]
    warn_inert_keys(configs[DEMO_METHODS[-1]].method, useless)
    return configs


def _inert_for(cfg: Config) -> tuple[str, ...]:
    """The method keys that have no effect on a run of ``cfg``: a finished run that differs from
    this command's settings only in those is still the same run."""
    return tuple(inert_method_keys(cfg.method, [k for k in valid_keys() if k.startswith("method.")]))


def _plan(run_dir: Path, configs: dict[str, Config], *, resume: bool, overwrite: bool) -> dict[str, str]:
    """What to do with each method's sub-run ``run_dir/<method>``: ``"reuse"`` (finished and
    evaluated with the same settings), ``"resume"`` (continue its ``last.pt``), ``"new"``.

    Checks what a sub-run will check, writing nothing. Raises RunDirError if the run dir is occupied
    without --resume/--overwrite, holds no demo to resume, a sub-run's settings differ, or it
    cannot be written."""
    from bayesncl.runs.layout import check_writable, refuse_a_run_in
    from bayesncl.runs.messages import RunDirError
    from bayesncl.runs.rundir import prepare_run_dir

    check_writable(run_dir)
    if overwrite:  # (without --resume or --overwrite a folder with files is refused below)
        refuse_a_run_in(run_dir, "the demo")  # --overwrite replaces a demo, not a pretrain run
    if not (resume or overwrite) and run_dir.exists() and any(run_dir.iterdir()):
        raise RunDirError(
            f"run dir {run_dir} already exists and is not empty; pass --resume to continue the demo in "
            "it, --overwrite to replace it, or choose another --run-dir"
        )
    plan = {}
    for name, cfg in configs.items():
        sub = run_dir / name
        if resume and variants.finished(sub) and (sub / "config.yaml").exists():
            advice = "resume with the same options and key=value overrides, or use --overwrite"
            variants.refuse_other_settings(sub, cfg, advice, ignore=_inert_for(cfg), prefix="--resume: ")
            variants.finished_metrics(sub, cfg=cfg)  # what reusing it reads: a damaged one said now
            plan[name] = "reuse"
        elif resume and (sub / "last.pt").exists():
            prepare_run_dir(sub, cfg, resume=True, overwrite=False)  # same settings? readable?
            plan[name] = "resume"
        else:  # with --resume: not begun, or killed before its first checkpoint (nothing to keep)
            prepare_run_dir(sub, cfg, resume=False, overwrite=overwrite or resume)
            plan[name] = "new"
    if resume and set(plan.values()) == {"new"}:
        names = " or ".join(str(run_dir / m / "last.pt") for m in configs)
        raise RunDirError(f"--resume: no demo run in {run_dir} to continue (no {names})")
    return plan


def run_demo(
    run_dir: Path | None, overrides: list[str], quick: bool = False, *, resume: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Pretrain + evaluate each method into ``run_dir/<method>``; write ``table.md``/``table.json``.

    ``resume``: continue an interrupted demo (a finished method is reused, one with a ``last.pt``
    continues from it, the others start); ``overwrite``: replace the demo in ``run_dir``. Raises
    ConfigError / DataError / RunDirError for bad configs, data or run dir, before the first epoch.
    """
    from bayesncl.app.train import pretrain
    from bayesncl.data import dataset_info
    from bayesncl.runs.messages import RunDirError

    if resume and overwrite:
        raise ConfigError("--resume and --overwrite contradict each other: continue the demo, or replace it")
    if resume and run_dir is None:
        raise ConfigError("--resume needs --run-dir DIR (the demo to continue)")
    configs = demo_configs(overrides, quick)
    for cfg in configs.values():
        dataset_info(cfg.data)
    run_dir = run_dir or Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    if resume and not run_dir.is_dir():
        raise RunDirError(f"--resume: no demo run in {run_dir} to continue (no such directory)")
    plan = _plan(run_dir, configs, resume=resume, overwrite=overwrite)
    print(f"run dir: {run_dir}")
    if overwrite:  # the sub-runs are replaced by pretrain(overwrite=True); the old table goes now
        for stem in ("table.md", "table.json", "curves.png"):
            (run_dir / stem).unlink(missing_ok=True)
    results: dict[str, dict[str, Any]] = {}
    t0 = time.time()
    for name, cfg in configs.items():
        sub = run_dir / name
        if plan[name] == "reuse":
            print(f"== {name}: reusing the finished run {sub} ==")
            results[name] = variants.finished_metrics(sub)
            continue
        what = f"continuing {sub}:" if plan[name] == "resume" else f"{cfg.model.backbone},"
        print(f"== {name}: {what} {cfg.train.epochs} epochs on {cfg.data.name} ==")
        t = time.time()
        replace = plan[name] == "new" and (resume or overwrite)  # with --resume: no checkpoint to keep
        m = pretrain(cfg, sub, resume=plan[name] == "resume", overwrite=replace)
        m["pretrain_eval_time_s"] = round(time.time() - t, 1)
        variants.save_metrics(sub, name, m)  # the time too, for a later --resume
        results[name] = m
    table = format_table(results)
    c = next(iter(configs.values()))
    test_split = f"Test split, {c.data.test_subset:,}-image subset" if c.data.test_subset else "Test split"
    header = (
        f"NCL vs BayesNCL on {c.data.name} ({c.data.train_subset or 'all'} train images, "
        f"{c.train.epochs} epoch(s), {c.model.backbone}, D={c.model.proj_dim}; "
        f"BayesNCL rho={configs['bayesncl'].method.rho}, lambda={configs['bayesncl'].method.lam}). "
        f"{test_split}; SC in %, entropies in nats, LP@1 = fast linear probe on frozen h."
    )
    variants.write_table(run_dir, "table", results, table, header, {m: run_dir / m for m in configs}, cfg=c,
                         heading="demo")
    print()
    print(header)
    print(table)
    print(
        f"\ntotal time {time.time() - t0:.0f} s; table saved to {run_dir / 'table.md'} and table.json, "
        "training curves to curves.png"
    )
    return results
