"""``python -m bayesncl`` (and ``torchrun -m bayesncl``): the command line."""

from bayesncl.app.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
