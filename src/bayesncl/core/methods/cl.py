"""CL: SimCLR (Chen et al. 2020), InfoNCE on the raw projector output, z = p (φ = identity)."""

from bayesncl.core.methods.common import CONTRASTIVE_STATS, INFO_NCE
from bayesncl.core.methods.registry import register_method
from bayesncl.core.methods.spec import Method

METHOD = register_method(
    Method("cl", nonneg="identity", terms=(INFO_NCE,), stats=CONTRASTIVE_STATS, doc=__doc__)
)
