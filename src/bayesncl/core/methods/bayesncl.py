"""BayesNCL (the paper's method): NCL with a gating head on sg(h) whose hard mask 1[α > 0.5]
(straight-through gradient) gates z before InfoNCE; the gate brings λ·KL(Bern(α) ‖ Bern(ρ))."""

from bayesncl.core.methods.common import CONTRASTIVE_STATS, INFO_NCE
from bayesncl.core.methods.registry import register_method
from bayesncl.core.methods.spec import Method

METHOD = register_method(
    Method("bayesncl", nonneg="rep_relu", gate="ste", terms=(INFO_NCE,), stats=CONTRASTIVE_STATS, doc=__doc__)
)
