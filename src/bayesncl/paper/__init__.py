"""The papers' tables and figures, fenced off from the library: ``bayesncl reproduce`` (reproduce,
studies, ncl_studies, mechanism), the store of runs they share (variants), the demo's
side-by-side table (demo) and ``bayesncl benchmark`` (benchmark, plain_simclr).

The method itself (config, core, data, metrics, runs) never imports this package; this package uses
the app's commands (pretrain, evaluate, finetune, dynamics, ood, report), and of the app only the CLI
imports it (tests/test_layers.py)."""
