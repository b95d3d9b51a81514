"""Seeds from integers: :func:`mix_seed`, one pure function (SplitMix64, no torch) that every seed of a
run is derived with: each rank's global RNG (:func:`bayesncl.core.distributed.rank_seed`), a resumed
run's RNG (``runs.rundir``), the data's order and augmentation of each epoch, rank and step
(:mod:`bayesncl.data.loaders`, which imports it from here: the core imports nothing outside the core).
"""

from __future__ import annotations

__all__ = ["mix_seed"]

_M64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def mix_seed(*parts: int) -> int:
    """A well-mixed non-negative 63-bit seed from integers, e.g. ``(seed, epoch, rank, step)``.

    Pure Python (SplitMix64), so it is identical across processes, platforms and torch versions.
    """
    h = 0x6A09E667F3BCC908
    for p in parts:
        h = _splitmix64(h ^ (int(p) & _M64))
    return h >> 1
