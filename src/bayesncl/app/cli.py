"""The ``bayesncl`` command. It only parses arguments (:data:`COMMANDS`) and calls library functions.

Every expected failure (bad config, missing data, occupied run dir, bad features file, an
operating-system fault, ...) is printed as one line ``bayesncl: error: ...`` with exit status 2,
never a traceback: :mod:`bayesncl.app.errors`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, NoReturn

from bayesncl.app.errors import readers_may_go, run_command, shorten
from bayesncl.config import RECIPES_DIR, Config, ConfigError, build_config, path_arg, valid_keys


def _keys_epilog() -> str:
    cfg = Config().to_dict()
    lines = ["config keys (section.key=default):"]
    for key in valid_keys():
        val: Any = cfg
        for part in key.split("."):  # eval.data.root: three levels
            val = val[part]
        lines.append(f"  {key}={val}")
    recipes = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
    if recipes:
        lines.append("recipes for --config (name or path): " + ", ".join(recipes))
    return "\n".join(lines)


def parse_dims(value: str | None) -> list[int] | None:
    """``--retrieval-dims 32,64`` → ``[32, 64]``; ``None`` (option not given) → ``None``.

    Raises ConfigError (one line) for an empty value, an empty entry, a non-integer or a K < 1.
    """
    if value is None:
        return None
    parts = [k.strip() for k in value.split(",")]
    try:
        dims = [int(k) for k in parts]
    except ValueError:
        dims = []
    if not dims or min(dims) < 1:
        msg = f"--retrieval-dims {value!r}: expected comma-separated positive integers, e.g. 32,64"
        raise ConfigError(msg) from None
    return dims


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line ``bayesncl: error: ...`` (exit 2), like every other."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"bayesncl: error: {shorten(message)} (see {self.prog} --help)\n")
        sys.exit(2)


def _run_dir(args: argparse.Namespace, what: str) -> Path | None:
    """``--run-dir`` of a command with ``--resume`` (continuing ``what``) and ``--overwrite``."""
    run_dir = path_arg(args.run_dir, "--run-dir", "a directory")
    if args.resume and run_dir is None:
        raise ConfigError(f"--resume needs --run-dir DIR ({what})")
    if args.resume and args.overwrite:
        raise ConfigError("--resume and --overwrite contradict each other: continue the run, or replace it")
    return run_dir


def cmd_pretrain(args: argparse.Namespace) -> int:
    from bayesncl.app.api import default_run_dir
    from bayesncl.app.train import pretrain
    from bayesncl.runs.export import resume_config

    run_dir_arg = _run_dir(args, "the run to continue")
    overrides = [*args.overrides, "data.skip_corrupt=true"] if args.skip_corrupt else args.overrides
    if args.resume and args.config is None:  # the run's config, key=value on top (train.epochs=400)
        assert run_dir_arg is not None
        cfg = resume_config(run_dir_arg, overrides)
    else:
        cfg = build_config(args.config, overrides, plugins=args.plugin)
    run_dir = run_dir_arg or default_run_dir(cfg)
    metrics = pretrain(cfg, run_dir, resume=args.resume, overwrite=args.overwrite, evaluate=not args.no_eval)
    if metrics:
        from bayesncl.app.report import format_table

        print(format_table({cfg.method.name: metrics}))
    return 0


def cmd_finetune(args: argparse.Namespace) -> int:
    from bayesncl.app.finetune import finetune

    path_arg(args.source, "RUN_DIR_OR_CHECKPOINT", "a run dir or checkpoint file")
    run_dir = _run_dir(args, "the finetune run to continue")
    finetune(args.source, run_dir, args.overrides, resume=args.resume, overwrite=args.overwrite)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from bayesncl.paper.demo import run_demo

    run_dir = path_arg(args.run_dir, "--run-dir", "a directory")
    run_demo(run_dir, args.overrides, quick=args.quick, resume=args.resume, overwrite=args.overwrite)
    return 0


def cmd_extract(args: argparse.Namespace) -> int:
    from bayesncl.app.evaluate import extract_command

    path_arg(args.source, "RUN_DIR_OR_CHECKPOINT", "a run dir or checkpoint file")
    path_arg(args.out, "--out", "a .npz file path")  # its suffix: extract_command, before any loading
    out = extract_command(args.source, split=args.split, out=args.out, overrides=args.overrides,
                          factors=args.factors)
    print(f"wrote {out}")
    return 0


def cmd_metrics(args: argparse.Namespace) -> int:
    from bayesncl.app.evaluate import metrics_command
    from bayesncl.metrics import format_metrics_table

    dims = parse_dims(args.retrieval_dims)
    result = metrics_command(args.features, dims, args.json, mig=args.mig)
    if args.json:  # exactly the metric keys (+ retrieval, + note on degenerate input)
        print(json.dumps({k: v for k, v in result.items() if k != "source"}, indent=2))
    else:
        print(format_metrics_table(result))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from bayesncl.app.evaluate import evaluate_command
    from bayesncl.app.report.html import write_run_report

    path_arg(args.source, "RUN_DIR_OR_CHECKPOINT", "a run dir or checkpoint file")
    dims = parse_dims(args.retrieval_dims)
    if args.probe_seeds is not None and args.probe_seeds < 1:
        raise ConfigError(f"--probe-seeds {args.probe_seeds}: expected >= 1")
    if args.probe_epochs is not None and args.probe_epochs < 1:
        raise ConfigError(f"--probe-epochs {args.probe_epochs}: expected >= 1")
    evaluate_command(
        args.source, retrieval_dims=dims, knn=not args.no_knn, overrides=args.overrides,
        probe_seeds=1 if args.probe_seeds is None else args.probe_seeds, probe=args.probe,
        probe_epochs=50 if args.probe_epochs is None else args.probe_epochs,
        given=[k for k in ("probe_seeds", "probe_epochs") if getattr(args, k) is not None],
        report=write_run_report,
    )
    return 0


_LOAD_OVERRIDES_HELP = (
    "config overrides: for a bayesncl run only data.* and eval.* (e.g. a new data.root); for an "
    "official BayesNCL/NCL checkpoint the data (data.name=cifar100 data.root=DIR) and, if not "
    "inferred right, method.name=cl|ncl|ncl-topk|bayesncl-gs"
)


def cmd_ood(args: argparse.Namespace) -> int:
    from bayesncl.app.ood import ood_command, parse_list, parse_severities

    path_arg(args.source, "RUN_DIR_OR_CHECKPOINT", "a run dir or checkpoint file")
    ood_command(args.source, corruptions=parse_list(args.corruptions, "corruptions"),
                severities=parse_severities(args.severities), seed=args.seed, cache=args.cache,
                overrides=args.overrides)
    return 0


def _data_root_only(overrides: list[str], command: str) -> list[str]:
    """The ``key=value`` words of a command that reads trained runs as they are (``dynamics``,
    ``report``): ``data.root=DIR`` alone, where their data lies now (a run records where it lay when
    it trained, and the data readers' advice is "set data.root"). ConfigError (one line) for a word
    that is not key=value, or any other key."""
    from bayesncl.config import parse_overrides

    other = [k for k in parse_overrides(overrides) if k != "data.root"]
    if other:
        raise ConfigError(
            f"{', '.join(other)}: {command} takes only data.root=DIR (where the run's data lies now, if it "
            "moved since the run trained); the run's own config sets the rest"
        )
    return overrides


def _is_key_value(word: str) -> bool:
    """Whether a word of ``report``'s RUN_DIR... list is a ``key=value`` rather than a run dir: a path
    that exists (a run dir named ``rho=0.3``), or whose part before ``=`` holds a ``/``
    (``runs/rho=0.3``), is a run dir, as it was before the list took ``data.root=DIR``."""
    key = word.split("=", 1)[0]
    return "=" in word and "/" not in key and not Path(word).exists()


def cmd_dynamics(args: argparse.Namespace) -> int:
    from bayesncl.app.dynamics import dynamics_command

    path_arg(args.run_dir, "RUN_DIR", "a run dir")
    if args.samples < 2:
        raise ConfigError(f"--samples {args.samples}: expected >= 2 (InfoNCE needs negatives)")
    if args.every < 1:
        raise ConfigError(f"--every {args.every}: expected >= 1")
    overrides = _data_root_only(args.overrides, "dynamics")
    dynamics_command(args.run_dir, samples=args.samples, every=args.every, overrides=overrides)
    return 0


def cmd_curves(args: argparse.Namespace) -> int:
    from bayesncl.app.report.curves import write_training_curves

    runs = [path_arg(r, "RUN_DIR", "a run dir or its log.csv") or Path(r) for r in args.runs]
    out = path_arg(args.out, "--out", "a .png file path")
    if out is None:  # one run: next to its log; several: here
        first = runs[0] if runs[0].is_dir() else runs[0].parent
        out = (first if len(runs) == 1 else Path()) / "training_curves.png"
    if out.suffix.lower() != ".png":
        raise ConfigError(f"--out {out}: expected a .png file path")
    print(f"wrote {write_training_curves(runs, out)}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from bayesncl.app.report.html import report_command

    words = [*args.runs, *args.overrides]  # (argparse gives RUN_DIR... every word before an option)
    keyed = [w for w in words if _is_key_value(w)]
    overrides = _data_root_only(keyed, "report")
    runs = [path_arg(r, "RUN_DIR", "a run dir") or Path(r) for r in words if r not in keyed]
    if not runs:
        raise ConfigError("report: give one or more RUN_DIR (data.root=DIR only says where their data lies)")
    print(f"report: {report_command(runs, path_arg(args.out, '--out', 'a folder'), overrides)}")
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from bayesncl.paper.reproduce import reproduce, weightless_runs
    from bayesncl.paper.studies import MECHANISM_IDS

    run_dir = path_arg(args.run_dir, "--run-dir", "a directory")
    store = path_arg(args.store, "--store", "a directory")
    if args.plan and args.list_weightless:
        raise ConfigError("--plan and --list-weightless: give one (--list-weightless prints only the hashes)")
    if args.time and not args.plan:
        raise ConfigError("--time times the runs of a --plan that no stored run's log.csv can estimate; "
                          "give it with --plan (a run without --plan times them itself)")
    if args.finished and (args.plan or args.list_weightless):
        other = "--plan" if args.plan else "--list-weightless"
        raise ConfigError(f"--finished and {other}: give one (--finished writes the table of the runs "
                          "finished)")
    modes = {"--plan": args.plan, "--finished": args.finished, "--list-weightless": args.list_weightless}
    given = [flag for flag, on in modes.items() if on]
    if args.train_only and given:
        raise ConfigError(f"--train-only and {given[0]}: give one (--train-only trains the table's runs and "
                          "writes no table)")
    if args.train_only and args.table in MECHANISM_IDS:
        why = ("table 6 trains no runs (it probes the encoders given)" if args.table == "6" else
               "the mechanism study keeps its runs in its run dir, not in a store")  # fmt: skip
        raise ConfigError(f"--train-only: {why}; give it to a table or figure ID")
    if args.finished and args.table in MECHANISM_IDS:
        raise ConfigError(f"--finished: {args.table} writes no table of stored runs; give it to a table or "
                          "figure ID")
    if args.table == "6" and (args.plan or args.list_weightless):
        flag, none = ("--plan", "no plan") if args.plan else ("--list-weightless", "no runs to list")
        raise ConfigError(f"{flag}: table 6 has {none}: it trains none, it probes the encoders given")
    if args.table in MECHANISM_IDS:  # issue 15: the background probe (6) and the mechanism study
        from bayesncl.paper import mechanism

        if args.plan:
            raise ConfigError("--plan: the mechanism study has no plan (it names each run as it reaches it); "
                              "--list-weightless lists the runs it would refuse for want of their weights")
        if args.seeds < 1:
            raise ConfigError(f"--seeds {args.seeds}: expected >= 1 (the number of pretraining seeds)")
        settings = [o for o in args.overrides if "=" in o]
        if args.table == "6":  # the other words are the encoders: checkpoints or run dirs
            if store:
                raise ConfigError("--store: table 6 trains no runs (it probes the encoders given)")
            sources = [o for o in args.overrides if "=" not in o]
            mechanism.table6(sources, args.dataset, run_dir, settings)
        elif args.list_weightless:
            names = mechanism.mechanism_weightless(args.dataset, run_dir, settings, seeds=args.seeds,
                                                   store=store)
            print("".join(f"{n}\n" for n in names), end="")
        else:
            mechanism.mechanism(args.dataset, run_dir, settings, seeds=args.seeds, store=store)
        return 0
    if args.list_weightless:  # one hash a line, nothing else: benchmarks/long_queue.sh reads it
        hashes = weightless_runs(args.table, args.dataset, run_dir, args.overrides, seeds=args.seeds,
                                 store=store)
        print("".join(f"{h}\n" for h in hashes), end="")
        return 0
    reproduce(args.table, args.dataset, run_dir, args.overrides, seeds=args.seeds, store=store,
              plan_only=args.plan, time_here=args.time or not args.plan, finished=args.finished,
              train_only=args.train_only)
    return 0


# ----------------------------------------------------------------------------- the parser, as data
_RAW = argparse.RawDescriptionHelpFormatter


def _arg(*flags: str, **kwargs: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
    """One ``add_argument(*flags, **kwargs)`` call, as data."""
    return flags, kwargs


def _flag(name: str, help: str) -> tuple[tuple[str, ...], dict[str, Any]]:
    return _arg(name, action="store_true", help=help)


_OVERRIDES = _arg("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
_PLUGIN = _arg(
    "--plugin", action="append", default=[], metavar="FILE.py",
    help="a Python file that registers a method (bayesncl.register_method; docs/extending.md); repeatable",
)
_LOAD_OVERRIDES = _arg("overrides", nargs="*", metavar="key=value", help=_LOAD_OVERRIDES_HELP)
_SOURCE = _arg("source", metavar="RUN_DIR_OR_CHECKPOINT")
_DATA_ROOT = _arg(
    "overrides", nargs="*", metavar="data.root=DIR",
    help="where the runs' data lies now, if it moved since they trained (the only key=value taken; the "
         "run's config sets the rest)",
)

# subcommand NAME (run by cmd_NAME) -> (help, description, more add_parser options, its arguments: _arg)
COMMANDS: dict[str, tuple[str, str, dict[str, Any], list[Any]]] = {
    "pretrain": (
        "pretrain one method and evaluate it",
        "Pretrain an encoder with CL / NCL / NCL+TopK / BayesNCL, checkpoint every epoch, "
        "and evaluate on the test split. The defaults are the authors' CIFAR hyperparameters (200 "
        "epochs, ResNet-18, CIFAR stem at <= 64 px) on Fashion-MNIST: a GPU-sized run. For a CPU-sized "
        "one start from --config fashion-mnist-demo; override anything with key=value. On a CPU it "
        "prints the projected training time before the first step (2 steps timed) and, past an hour, "
        "names the CPU recipes; the evaluation says its stages on stderr (train.progress=false: neither).",
        {"formatter_class": _RAW, "epilog": _keys_epilog},
        [
            _arg("--config", help="YAML file or shipped recipe name (see below)"),
            _arg("--run-dir", help="output directory (default runs/<method>-<data>-<time>)"),
            _flag("--resume", "continue the run in --run-dir from last.pt"),
            _flag("--overwrite", "replace a run already in --run-dir"),
            _flag("--no-eval", "skip the end-of-training evaluation"),
            _flag("--skip-corrupt",
                  "skip unreadable images in an image folder and report how many (= data.skip_corrupt=true)"),
            _OVERRIDES,
            _PLUGIN,
        ],
    ),
    "finetune": (
        "fine-tune a pretrained encoder end to end with a linear head; test accuracy",
        "Train the backbone of a pretrained run (or checkpoint) and a new linear head on h end to end "
        "on the labelled train split, then report test Acc@1/Acc@5 (finetune.json/.md). Default: the "
        "authors' protocol for the data (eval.finetune_protocol=auto|cifar|imagenet; auto: imagenet for "
        "data.name=imagefolder, else cifar). cifar: 30 epochs, batch 256, LARS lr 0.4 x batch/256 for "
        "backbone and head, weight decay 1e-4, 10-epoch warmup then cosine; imagenet: 30 epochs, batch "
        "256, SGD lr 1.0 x batch/256, momentum 0.9, weight decay 0, x0.1 at epochs 60 and 80; crops and "
        "flips. Size it for a CPU with train.* "
        "overrides (train.epochs=3 train.warmup_epochs=1). It writes its own run dir (checkpoint every "
        "epoch, --resume, --overwrite) and never alters the pretrained run. data.* and eval.* as for "
        "evaluate (a run pretrained without labels: eval.data.name=... eval.data.root=DIR).",
        {},
        [
            _SOURCE,
            _arg("--run-dir", help="output directory (default <run>-finetune beside the run)"),
            _flag("--resume", "continue the finetune run in --run-dir from its last.pt, with its config "
                  "(key=value on top, as pretrain --resume); RUN_DIR_OR_CHECKPOINT must still be there: its "
                  "config (not its weights) is checked to be the model the run fine-tunes"),
            _flag("--overwrite", "replace a run already in --run-dir"),
            _arg("overrides", nargs="*", metavar="key=value",
                 help="train.* and seed on top of the authors' protocol; data.* and eval.*"),

            _PLUGIN,
        ],
    ),
    "demo": (
        "the main job: NCL vs BayesNCL on Fashion-MNIST, side-by-side table",
        "Pretrain NCL and BayesNCL with the same budget on 12,000 Fashion-MNIST images at "
        "train.precision=auto (bf16 autocast where the CPU computes bf16 natively, fp32 elsewhere): 212 s, "
        "about 3.5 min, measured on 2 idle AVX512-BF16 cores 2026-12-04 (train.precision=fp32 "
        "data.train_subset=20000 is the former fp32 demo: 474 s), evaluate both on the test split and "
        "print one "
        "table (also saved as "
        "table.md and table.json in the run dir). key=value overrides apply to both runs (not "
        "method.name: the demo runs ncl and bayesncl), except method keys that have no effect on ncl "
        "(method.rho, method.lam, ...: they set the bayesncl run). An interrupted demo continues with "
        "--resume (the same --run-dir, options and overrides): a method that finished is reused, one "
        "with a last.pt continues from it.",
        {"formatter_class": _RAW},
        [
            _arg("--run-dir", help="output directory (default runs/demo-<time>)"),
            _flag("--quick", "a ~1 minute smoke version of the demo"),
            _flag("--resume", "continue the demo in --run-dir"),
            _flag("--overwrite", "replace a demo already in --run-dir"),
            _OVERRIDES,
            _PLUGIN,
        ],
    ),
    "extract": (
        "write one features file (h, p, z, z~, alpha, mask, labels) for a split",
        "Run a trained encoder over a split and write one .npz features file that every metric reads.",
        {},
        [
            _SOURCE,
            _arg("--split", choices=("test", "train"), default="test", help="which split (default test)"),
            _arg("--out", help="output .npz (default RUN_DIR/features_<split>.npz; for RUN/epoch-NNNN.pt "
                 "RUN/eval-epoch-NNNN/features_<split>.npz)"),
            _flag("--factors", "require the generative factors (dsprites) in the file: an error for a "
                  "dataset without them (they are stored whenever the dataset has them)"),
            _LOAD_OVERRIDES,

            _PLUGIN,
        ],
    ),
    "ood": (
        "out-of-distribution transfer: the linear probe on clean train h, tested on shifted test sets",
        "Fit the fast linear probe on the clean train split's frozen h once, then score it on every "
        "corruption x severity of the test split (the ImageNet-C corruptions, imagecorruptions package; "
        "cached, deterministic by --seed) or, for data.name=imagefolder, on the released imagenet-c/, "
        "imagenet-sketch/ and stylized-imagenet/ folders under data.root. Writes ood.json, ood.md, ood.png.",
        {},
        [
            _SOURCE,
            _arg("--corruptions", help="comma-separated names (default the 15 ImageNet-C benchmark ones; "
                 "'all' adds speckle_noise, gaussian_blur, spatter, saturate)"),
            _arg("--severities", help="comma-separated severities 1-5 (default 1,2,3,4,5)"),
            _arg("--seed", type=int, default=0, help="the corruptions' and the probe's seed (default 0)"),
            _arg("--cache", help="folder of the corrupted copies (default ~/.cache/bayesncl/corrupted)"),
            _LOAD_OVERRIDES,
            _PLUGIN,
        ],
    ),
    "metrics": (
        "interpretability metrics of a features file or any .npz with features+labels",
        "Semantic consistency, semantic entropies, activation ratio, sparsity, effective "
        "rank, orthogonality and (optionally) retrieval with feature selection.",
        {},
        [
            _arg("features", metavar="FEATURES", help="features .npz (from extract, or any npz holding "
                 "'features' (N x D float) and 'labels' (N int))"),
            _flag("--json", "print JSON instead of a table"),
            _arg("--retrieval-dims", help="comma-separated K list, e.g. 32,64,128 (adds NCL's own "
                 "retrieval map at each K)"),
            _flag("--mig", "require MIG (an error for a file without 'factors'); a file with factors "
                  "reports it anyway"),
        ],
    ),
    "evaluate": (
        "extract + metrics + linear probe + kNN + retrieval + top-activation figure",
        "Full evaluation of a run dir or checkpoint; writes evaluation.json, "
        "evaluation.md and top_activations.png into the run dir (for an earlier checkpoint "
        "RUN/epoch-NNNN.pt: into RUN/eval-epoch-NNNN/); eval.figures=false draws no figure.",
        {},
        [
            _SOURCE,
            _arg("--retrieval-dims", help="comma-separated K list (default 32,64,...,D)"),
            _flag("--no-knn", "skip the kNN classifier"),
            _arg("--probe-seeds", type=int, help="linear probe seeds; mean ± std (default 1)"),
            _arg(
                "--probe", choices=("fast", "paper", "none"),
                help="fast: L-BFGS on precomputed h (CPU-friendly); paper: the authors' protocol of "
                "eval.probe_protocol (auto: imagenet for data.name=imagefolder, else cifar; cifar: LARS lr "
                "0.4, warmup-cosine; imagenet: SGD lr 1.0, x0.1 at epochs 60, 80), crops+flips, "
                "--probe-epochs (GPU); none: no linear or feature-selection probe (default: the run's "
                "eval.probe, fast unless set)",
            ),
            _arg("--probe-epochs", type=int, help="epochs of the paper probe (default 50)"),
            _LOAD_OVERRIDES,
            _PLUGIN,
        ],
    ),
    "reproduce": (
        "one command per table or figure of both papers, mean ± std over seeds, ours vs the paper",
        "Pretrain every variant a table or figure needs (recipes in src/bayesncl/configs) once per "
        "seed 0..N-1, evaluate them, and write <stem>.md/.json (each cell: mean, std, per-seed values, "
        "the paper's value) and, for figures, <stem>.png with error bars. A run is identified by its "
        "resolved config and seed: it is trained once into the store (STORE/<hash>/) and reused by "
        "every table and invocation that needs it; an interrupted run continues. The plan (runs to "
        "train, to continue, reused, estimated time) is printed first. IDs: 1, 2, 4, 7 (BayesNCL "
        "Tables 1, 2, 4, 7), 3 (gradient dynamics), 5 (ResNet-50), 9 (Tables 9/10: every metric of every "
        "ablation), 15 (gating-head lr), fig3 "
        "(retrieval vs K), fig4a (SC vs D), fig4b (SC, LP@1, open rate vs rho and lambda), ncl-fs (NCL "
        "feature "
        "selection: top-K vs random K probes, our mAP@10, NCL's own map, transfer top-K/random K), "
        "ncl-sepin (NCL SEPIN@k), ncl-finetune (NCL "
        "fine-tuning accuracy: bayesncl finetune of CL, NCL, BayesNCL), ncl-sparsity (L1 vs "
        "non-negativity), ncl-spectral (spectral CL), ncl-supervised (CE/NCE, SupCon), ncl-dead (ReLU vs "
        "rep_relu dead dims), ncl-mig (MIG on dSprites), ncl-ood (linear probe on corrupted/shifted test "
        "sets), appj (BayesNCL Appendix J on fashion-mnist-bg), 6 (background probe of "
        "CHECKPOINT_OR_RUN... on waterbirds "
        "or fashion-mnist-bg), mechanism (CL, NCL, BayesNCL, NCL-IPW on fashion-mnist-bg), convergence "
        "(SC, active dims, gate-open rate, AF-GV, LP@1 per checkpoint), headline (NCL against BayesNCL "
        "at the given method.rho/method.lam and backbone; NCL's runs are reused across ρ/λ). "
        "CIFAR/ImageNet-100 recipes are GPU-scale; --dataset "
        "fashion-mnist uses the demo recipe as written (3 epochs, 20,000 images, fp32), fashion-mnist-long "
        "the long CPU recipe (~30x its steps). "
        "key=value overrides apply to every variant.",
        {},
        [
            _arg("table", metavar="ID",
                 help="1 2 3 4 5 7 9 15 fig3 fig4a fig4b ncl-fs ncl-sepin ncl-finetune convergence "
                      "headline ncl-sparsity ncl-spectral ncl-supervised ncl-dead ncl-mig ncl-ood appj 6 "
                      "mechanism"),
            _arg("--dataset", default="cifar100",
                 help="cifar10 | cifar100 | imagenet100 | fashion-mnist | fashion-mnist-long (default "
                      "cifar100); for 6: waterbirds | fashion-mnist-bg; for mechanism: fashion-mnist-bg | "
                      "fashion-mnist-bg-long"),
            _arg("--seeds", type=int, default=1, help="pretrain every variant with seeds 0..N-1 (default 1)"),
            _arg("--run-dir",
                 help="where the table goes (default runs/<stem>-<dataset> and each override as key=value, "
                      "method. left off, not data.root, train.progress and the like, e.g. "
                      "runs/table1-cifar100, runs/headline-cifar100-rho=0.8-lam=3e-05; 6 and mechanism: "
                      "runs/table6-<dataset>, "
                      "runs/mechanism-<dataset>)"),
            _arg("--store", help="the shared store of runs (default: variants/ beside the run dir; "
                                 "mechanism: its runs inside the run dir)"),
            _arg("--plan", action="store_true",
                 help="print the plan (runs to train, continue, reuse; marked: the runs that lack weights "
                      "the table reads, last.pt or epoch-NNNN.pt, which it would refuse) and stop: nothing "
                      "is trained or written; estimates from stored runs' log.csv, others not timed "
                      "unless --time"),
            _arg("--time", action="store_true",
                 help="with --plan: time 3 training steps here for the runs no stored run's log.csv "
                      "estimates (minutes on a CPU for a GPU recipe)"),
            _arg("--finished", action="store_true",
                 help="train nothing: write the table (and figure) from the runs already finished in the "
                      "store, a cell without its run left empty (a long queue's results so far)"),
            _arg("--train-only", action="store_true",
                 help="train (or continue) the table's runs and stop, writing no table; a run another "
                      "process is training (its lock) is passed over, so several processes given the same "
                      "command and --store (one per GPU or machine) split the runs; then the command "
                      "without --train-only writes the table"),
            _arg("--list-weightless", action="store_true",
                 help="print the name of each run the table (or mechanism) would refuse for weights it "
                      "lacks (those --plan marks; a store hash, or mechanism's folder without --store),"
                      " one a line, and stop: nothing else is printed or "
                      "written (benchmarks/long_queue.sh sets them aside before each table, which then "
                      "trains them again)"),
            _OVERRIDES,
            _PLUGIN,
        ],
    ),
    "dynamics": (
        "gradient dynamics (paper Table 3): Spearman AF-GV, GV-SC, AF-SC per checkpoint",
        "For every periodic checkpoint epoch-NNNN.pt of a run: activation frequency and "
        "semantic consistency per dim on the test split, gradient variance per dim on augmented train "
        "views, and their Spearman correlations. Writes dynamics.json/.md/.png (protocol: "
        "docs/metrics.md).",
        {},
        [
            _arg("run_dir", metavar="RUN_DIR"),
            _DATA_ROOT,
            _arg("--samples", type=int, default=1024,
                 help="train images for the gradient variance (default 1024)"),
            _arg("--every", type=int, default=1,
                 help="use checkpoints 1, 1+N, 1+2N, ... of the sorted periodic ones (default 1: all)"),
            _PLUGIN,
        ],
    ),
    "curves": (
        "plot training curves (InfoNCE, online probe, KL, gate open vs rho) of one or more runs",
        "Read each run's log.csv (one row per finished epoch) and draw InfoNCE, online "
        "probe accuracy and, for gated runs, the KL term and the gate-open rate against rho, one line "
        "per run (a fine-tuning run: its train accuracy). pretrain and finetune write the same figure as "
        "training_curves.png when a run ends; this "
        "command draws runs in progress too, or several runs side by side.",
        {},
        [
            _arg("runs", nargs="+", metavar="RUN_DIR", help="run dirs (or their log.csv files)"),
            _arg("--out", help="output .png (default: RUN_DIR/training_curves.png for one run, "
                 "./training_curves.png for several)"),
            _PLUGIN,
        ],
    ),
    "report": (
        "a static HTML report (opens from disk): metrics, curves, figures, a page per dimension",
        "Write a browsable HTML site of one or more runs (demo and reproduce run dirs: the runs in "
        "their sub-folders): config, metrics, training curves and figures; several runs side by side; "
        "every active dimension in one sortable table (SC_k, majority class, firing rate, mean "
        "activation, gate-open rate), each with a page of its top-activating test images, images "
        "across its activation quantiles, histograms, where the gate closed it, and its most correlated "
        "dimensions. Reads features_test.npz (from evaluate or extract), else extracts the features "
        "from last.pt. Opens from file:// with no server and no network.",
        {},
        [
            _arg("runs", nargs="+", metavar="RUN_DIR", help="run dirs, or demo/reproduce run dirs"),
            _DATA_ROOT,
            _arg("--out", help="output folder (default RUN_DIR/report for one, ./report for several)"),
            _PLUGIN,
        ],
    ),
}


def _version() -> str:
    """The installed distribution's version; the package's own ``__version__`` when it runs from a
    source tree that pip never installed (``PYTHONPATH=src python -m bayesncl``)."""
    try:
        return version("bayesncl")
    except PackageNotFoundError:  # the root package is loaded (this module is inside it); importing it
        # here would close a cycle (tests/test_layers.py)
        return f"{sys.modules['bayesncl'].__version__} (source tree, not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The ``bayesncl`` parser: one subparser per :data:`COMMANDS` entry, and ``benchmark``."""
    from bayesncl.paper.benchmark import add_benchmark_parser

    parser = OneLineParser(
        prog="bayesncl", description="Interpretable self-supervised learning: CL, NCL, NCL+TopK and BayesNCL."
    )
    parser.add_argument("--version", action="version", version=f"bayesncl {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help, description, options, arguments) in COMMANDS.items():
        epilog = options.get("epilog")
        options = {**options, "epilog": epilog() if callable(epilog) else epilog}
        p = sub.add_parser(name, help=help, description=description, **options)
        for flags, kwargs in arguments:
            p.add_argument(*flags, **kwargs)
        p.set_defaults(func=globals()[f"cmd_{name}"])  # (looked up now: a test may replace one)
    add_benchmark_parser(sub)
    return parser


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The parser of subcommand ``command`` (``parser`` itself when there is none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``bayesncl`` command: exit status 0, or 2 after one line ``bayesncl: error: ...``
    (:func:`bayesncl.app.errors.run_command`)."""
    with readers_may_go():
        parser = build_parser()
        # key=value overrides may appear before or after options: argparse leaves the later ones over.
        args, extra = parser.parse_known_args(argv)
        if extra:
            sources = getattr(args, "table", None) == "6"  # reproduce 6 also takes CHECKPOINT_OR_RUN words
            words = all(("=" in e or sources) and not e.startswith("-") for e in extra)
            if hasattr(args, "overrides") and words:
                args.overrides = [*args.overrides, *extra]
            else:  # the subcommand's parser, so that the hint points to its --help
                _subparser(parser, getattr(args, "command", None)).error(
                    f"unrecognized arguments: {' '.join(extra)}"
                )
        if not getattr(args, "command", None):
            parser.print_help()
            return 0
        return run_command(lambda: _load_plugins(args) or args.func(args), args.command)


def _load_plugins(args: argparse.Namespace) -> None:
    """Import each ``--plugin FILE.py`` (its methods register themselves) before the command runs."""
    from bayesncl.core.plugins import load_plugin

    for path in getattr(args, "plugin", None) or []:
        load_plugin(path)


if __name__ == "__main__":
    sys.exit(main())
