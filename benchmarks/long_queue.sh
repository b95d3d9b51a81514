#!/usr/bin/env bash
# The long-budget queue (issues 24-26): the contested tables at the `fashion-mnist-long` recipe, 3 seeds,
# one after another on this machine's CPU. A run takes ~9 min (bf16, AVX512-BF16 CPU) to ~20 min (fp32,
# AVX2-only CPU) on 2 cores, so the queue spans sessions and machines; what carries it across is
# results/long-store/: the small files of every finished run (config.yaml, log.csv, metrics.json/.md,
# reproduce.json: what a table reads of a reused run, no checkpoints, no features), committed to git.
#
#   bash benchmarks/long_queue.sh restore   # copy results/long-store/ into the store (never overwrites)
#   bash benchmarks/long_queue.sh pack      # copy the store's finished runs' small files into results/long-store/
#   bash benchmarks/long_queue.sh run       # restore, then each table of QUEUE in order, packing after each
#   bash benchmarks/long_queue.sh run ID... # the same, only QUEUE's jobs whose table ID is one of these
#   bash benchmarks/long_queue.sh again HASH...  # set these stored runs aside by hand (see below)
#
# A restored run is reused by the tables whose measures its reproduce.json already holds; a table that
# needs its weights for a measure not cached there (ncl-ood, fine-tuning, Table 3's trajectory) names
# every such run before it trains anything and retrains nothing by itself. So before each table `run`
# asks it which runs it would refuse for want of weights (`reproduce ... --list-weightless`: one hash a
# line, nothing written) and sets exactly those aside (into $STORE/no-weights/, which restore and pack
# leave out), so that the table trains them again; a run whose reproduce.json caches what the table
# reads stays, and is reused. Store: $STORE (default ~/bayesncl-store; a relative one: from where the
# script is started, though it runs in the repository). Run it with the package
# importable (`pip install -e .`, or PYTHONPATH=src) and nothing else on the cores; beside other work, start it
# with OMP_NUM_THREADS=1 (docs/decisions.md, "The queue at one thread while the cores are shared").
# Two workers, one a core, each from its own checkout with OMP_NUM_THREADS=1 and its own tables, e.g.
# `run 1 3 fig3 ncl-sepin ncl-sparsity fig4a` in one and `run headline 5 ncl-supervised` in the other
# (plain `run` is every job). Give them tables that read no run in common: two processes never train
# one run dir at once (its lock: the second table stops, saying the run is in use), and a table that
# reads weights (Table 3, fig3, ncl-sepin, ncl-sparsity, ncl-supervised, ncl-ood, ...: what
# `reproduce ... --list-weightless` lists) sets aside a stored run without them, taking it from under
# any other table that reads it; fig4a reads Table 1's NCL and BayesNCL runs, so it goes after the
# tables that set those aside, in the same worker.
set -uo pipefail
STORE="${STORE:-$HOME/bayesncl-store}"
case $STORE in /*) ;; *) STORE="$PWD/$STORE" ;; esac  # a relative one: where the script was started
cd "$(dirname "$0")/.."
SEEDS="${SEEDS:-results/long-store}"
PY="${PYTHON:-python}"
# fp32 on every machine (the recipe's `auto` is bf16 only on CPUs with native bf16, and a bf16 run is
# another run): the committed runs are reused wherever the queue continues, at ~1.8x the time of bf16 on
# an AVX512-BF16 CPU. The long tables up to Table 1 were bf16 (CONFIG.md); issue 23 found bf16 within
# the seed spread of fp32.
# A job's own `--seeds N` wins over the default 3 (it comes later on the command line).
# The tables of issues 24-26 are done (CONFIG.md); their jobs were, in order:
#   15, 4, appj, mechanism (fashion-mnist-bg-long), ncl-dead, ncl-spectral, ncl-ood, ncl-dead bicubic,
#   ncl-finetune, 2, ncl-mig (data.image_size=32), 9.
# Order then: issue 24's contested tables (Table 4 before the mechanism: it was half trained when session 14
# stopped, and the mechanism's runs go to the store only from session 15's `mechanism --store`), then 25's and
# 26's at the long budget. Later IDs reuse earlier runs (ncl-ood trains only CL; ncl-sparsity reuses
# ncl-ood's CL and ncl-dead's NCL; ncl-finetune and 9 train no new pretraining run). New pretraining
# runs per entry (a planning pass at 935f359): 15: 7, mechanism: 24, 4: 12, ncl-dead: 6, ncl-spectral: 9
# (issue 25's last), ncl-ood: 3 (+ its 3 BayesNCL runs again: restored without weights, set aside before
# it), ncl-dead bicubic (issue 26: the authors' bicubic crop against our bilinear, on
# NCL): 6, appj: 9 (the mechanism's bg runs again, for their weights), ncl-mig: 9 (at 32 px), 9: 12 (Table
# 4's again), 1: 6 (fp32; after 9, which issue 26 asks for).
# Then, beyond the issues' tables: fig4b (ρ and λ swept around the recipe's, ~24 runs), which asks whether
# another ρ or λ restores BayesNCL's SC lead that Table 1 at 100 epochs did not show (CONFIG.md); then
# ncl-supervised and ncl-sparsity, which need > 2 h here (12 new runs each) and so were run at the 3-epoch
# budget first, as issue 25 says (CONFIG.md): at 100 epochs they are a check of those readings.
L="--dataset fashion-mnist-long train.precision=fp32"
QUEUE=(
    # issue 44 first. Done: the headline at the paper's ρ = 0.8, λ = 3e-5 (3 seeds; session 25).
    # Fig. 4(b) at 100 epochs, one seed a cell: the λ lines at the paper's ρ = 0.8 and the recipe's 0.3, then
    # ρ swept at the paper's λ = 3e-5 (~16 runs, ~9 min each in fp32 on idle AVX-512 cores)
    "fig4b $L --seeds 1 method.lam=3e-05"
    # then at the best cell of Fig. 4(b) (@BEST@: its highest SC, see best_cell below): ρ swept at its λ
    # (the λ lines reused), the headline with 3 seeds, Table 1 (CL and NCL read no ρ/λ: reused where
    # stored in fp32), Table 3, and the ResNet-18 check (the demo's backbone, ImageNet stem, 50 epochs)
    "fig4b $L --seeds 1 @BEST_LAM@"
    "headline $L @BEST@"
    "1 $L @BEST@"
    "3 $L @BEST@"
    "headline $L model.backbone=resnet18 model.cifar_stem=false train.epochs=50 train.warmup_epochs=5 @BEST@"
    # issue 47 item 7: the figures that exist only at the 3-epoch budget; Table 5 (ResNet-50 with the 3-epoch
    # table's ImageNet stem: the CIFAR stem costs ~20x at 28 px) for 10 epochs of the 10,000 images, aimed at
    # ~10 min a run in fp32; measured ~23 min at one thread beside a second worker (docs/decisions.md,
    # "Budgets of the long checks of other backbones")
    "fig3 $L" "fig4a $L" "ncl-sepin $L"
    "5 $L model.cifar_stem=false train.epochs=10 train.warmup_epochs=1"
    "ncl-supervised $L" "ncl-sparsity $L"
)

# best_cell: "method.rho=R method.lam=X", the cell of Fig. 4(b) (fig4b's first job above, its every run
# finished) with the highest SC; @BEST@ in a job stands for it, @BEST_LAM@ for its method.lam=X alone.
# It reads the packed runs ($SEEDS: what `run` packs after each table, and git keeps), not the store: a
# table that reads weights (fig3) sets a Fig. 4(b) run aside and trains it again, and the store's
# half-trained copy would leave no best cell for the jobs after it.
# Nothing (and the job is skipped, saying so) while a run of Fig. 4(b) has not finished.
best_cell() {
    local dir
    dir=$(mktemp -d)
    # shellcheck disable=SC2086  # $L is words
    $PY -m bayesncl reproduce fig4b $L --seeds 1 method.lam=3e-05 --store "$SEEDS/variants" --run-dir "$dir" \
        --finished >/dev/null 2>&1
    $PY -c '
import json, re, sys
try:
    table = json.load(open(sys.argv[1]))
except OSError:
    sys.exit(0)
if table.get("missing"):
    sys.exit(0)
sc = {k: c["semantic_consistency"]["mean"] for k, c in table["rows"].items()}
best = max((v, k) for k, v in sc.items() if v is not None)[1]
rho, lam = re.fullmatch(r"rho=(\S+) lambda=(\S+)", best).groups()
print(f"method.rho={rho} method.lam={lam}")' "$dir/fig4b.json"
    rm -rf "$dir"
}

# copy_finished SRC DST [keep]: every SRC/<kind>/<run>/ holding metrics.json, its small files only,
# into DST (not SRC/no-weights/: runs set aside); with "keep" (restore) a run already in DST,
# finished or not, is left as it is (a committed metrics.json beside a local half-trained run's log.csv
# would make a run no one trained), and so is one DST set aside (DST/no-weights/<run>: its table
# trains it again)
copy_finished() {
    local src=$1 dst=$2 keep=${3:-} run f
    for run in "$src"/*/*/; do
        [ -f "$run/metrics.json" ] || continue
        run=${run%/}
        [ "$(basename "$(dirname "$run")")" = no-weights ] && continue
        if [ -n "$keep" ] && [ -d "$dst/no-weights/$(basename "$run")" ] && [ ! -d "$dst/${run#"$src"/}" ]; then
            echo "restore: left out $(basename "$run"): set aside in $dst/no-weights/ to be trained again"
            continue
        fi
        if [ -n "$keep" ] && [ -d "$dst/${run#"$src"/}" ]; then
            [ -f "$dst/${run#"$src"/}/metrics.json" ] || echo "restore: kept the unfinished $dst/${run#"$src"/} (continues there; move it away to take the committed run)"
            continue
        fi
        mkdir -p "$dst/${run#"$src"/}"
        for f in config.yaml log.csv metrics.json metrics.md reproduce.json; do
            [ -f "$run/$f" ] && cp "$run/$f" "$dst/${run#"$src"/}/"
        done
    done
    return 0
}

# set_aside HASH...: each stored run $STORE/variants/HASH into $STORE/no-weights/HASH (one there before
# it is replaced), so that the next table that reads it trains it again; a hash not in the store is said
# in one line. The hashes: those a table would refuse for want of weights (weightless, below), or given
# by hand (`again HASH...`).
set_aside() {
    local h
    for h in "$@"; do
        if [ -z "$h" ] || [ "$h" = . ] || [ "$h" = .. ] || [ "$h" != "${h%/*}" ]; then
            echo "again: $h is not the name of a run in the store: nothing set aside"
            continue
        fi
        if [ ! -d "$STORE/variants/$h" ]; then
            echo "again: no run $h in $STORE/variants/: nothing set aside"
            continue
        fi
        mkdir -p "$STORE/no-weights"
        rm -rf "${STORE:?}/no-weights/$h" && mv "$STORE/variants/$h" "$STORE/no-weights/$h"
        echo "again: set $h aside in $STORE/no-weights/: the next table that reads it trains it again"
    done
}

# weightless JOB: the store hashes of the runs the table JOB would refuse for want of their weights
# (finished runs without last.pt whose reproduce.json lacks a measure it reads from them, runs without
# the epoch-NNNN.pt it reads), one a line, as `reproduce JOB --list-weightless` lists them (it writes
# nothing); nothing where it fails (the table itself then says why)
weightless() {
    # shellcheck disable=SC2086  # the job is words
    $PY -m bayesncl reproduce --seeds 3 $1 --store "$STORE/variants" --list-weightless \
        || echo "again: could not list what $1 would refuse (its run below says why)" >&2
}

case "${1:-run}" in
    restore) [ -d "$SEEDS" ] && copy_finished "$SEEDS" "$STORE" keep; echo "restored $SEEDS into $STORE" ;;
    pack) copy_finished "$STORE" "$SEEDS"; echo "packed $STORE into $SEEDS: git add $SEEDS" ;;
    run)
        [ $# -gt 0 ] && shift
        for id in "$@"; do
            known=
            for job in "${QUEUE[@]}"; do [ "$id" = "${job%% *}" ] && known=1; done
            [ -n "$known" ] || echo "run: no job of the queue is table $id: nothing run for it"
        done
        [ -d "$SEEDS" ] && copy_finished "$SEEDS" "$STORE" keep
        for job in "${QUEUE[@]}"; do
            if [ $# -gt 0 ]; then
                given=
                for id in "$@"; do [ "$id" = "${job%% *}" ] && given=1; done
                [ -n "$given" ] || continue
            fi
            if [[ $job == *@BEST* ]]; then
                best=$(best_cell)
                if [ -z "$best" ]; then
                    echo "=== skipped $job: Fig. 4(b) has runs not finished, so no best cell yet"
                    continue
                fi
                job=${job//@BEST_LAM@/${best#* }}
                job=${job//@BEST@/$best}
            fi
            echo "=== $job $(date -u +%FT%H:%MZ)"
            # shellcheck disable=SC2046  # one hash a line: words
            set_aside $(weightless "$job")
            # shellcheck disable=SC2086  # the job is words
            $PY -m bayesncl reproduce --seeds 3 $job --store "$STORE/variants"
            echo "=== done rc=$? $(date -u +%FT%H:%MZ)"
            copy_finished "$STORE" "$SEEDS"
        done ;;
    again)
        shift
        [ $# -gt 0 ] || { echo "usage: bash benchmarks/long_queue.sh again HASH... (the stored runs to set aside)" >&2; exit 2; }
        set_aside "$@" ;;
    *) echo "usage: bash benchmarks/long_queue.sh [run [ID...]|pack|restore|again HASH...]" >&2; exit 2 ;;
esac
