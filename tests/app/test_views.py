"""extract_views: two augmented views of the same images through a model (SEPIN about x)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bayesncl import metrics as M
from bayesncl.app.views import extract_views
from bayesncl.config import build_config
from bayesncl.core.model import build_model
from bayesncl.metrics.inputs import EvalError

from ..conftest import TINY


def test_extract_views_shape_determinism_and_sepin() -> None:
    cfg = build_config(overrides=[*TINY, "method.name=ncl"])
    torch.manual_seed(0)
    model = build_model(cfg, 3, 16, 10)
    views = extract_views(model, cfg, torch.device("cpu"), 40)
    assert views.shape == (40, 2, cfg.model.proj_dim) and views.dtype == np.float32
    assert not np.allclose(views[:, 0], views[:, 1])  # two different augmentations of each image
    np.testing.assert_array_equal(views, extract_views(model, cfg, torch.device("cpu"), 40))  # seeded
    norms = np.linalg.norm(views, axis=2)
    np.testing.assert_allclose(norms, 1.0, atol=1e-4)  # z̃ rows are unit vectors
    info, sep = M.sepin_input_scores(views)
    assert info.shape == sep.shape == (cfg.model.proj_dim,) and (info >= 0).all() and (sep >= 0).all()
    with pytest.raises(EvalError, match="at least 2 images"):
        extract_views(model, cfg, torch.device("cpu"), 1)
