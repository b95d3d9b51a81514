"""The seed mixer: one pure function in the core, the same integers as before it moved out of the data."""

from __future__ import annotations

from bayesncl.core.distributed import rank_seed
from bayesncl.core.seeding import mix_seed


def test_mix_seed_gives_the_integers_every_stored_run_was_seeded_with():
    # the values of data.augment.mix_seed before it moved to the core: a run's order, augmentation and
    # rank seeds are these, so the digits of stored runs repeat
    assert mix_seed() == 3820445788478006404
    assert mix_seed(0) == 963809279175046933 == mix_seed(2**64)  # 64-bit parts
    assert mix_seed(1, 2) == 3725229383147624623 and mix_seed(2, 1) == 7909398901093424007
    assert mix_seed(0, 0, 0, 0) == 3313913236289419115 and mix_seed(-1) == 8852508888053592599
    assert rank_seed(7, 3) == mix_seed(7, 3, 0xD15EED) == 1139131554160453061 and rank_seed(7, 0) == 7


def test_the_data_seeds_with_the_cores_function():
    from bayesncl import data
    from bayesncl.data import augment, loaders

    assert data.mix_seed is augment.mix_seed is loaders.mix_seed is mix_seed
