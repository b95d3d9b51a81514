"""NCL: non-negative contrastive learning (Wang et al. 2024), InfoNCE on z = φ(p), φ = RepReLU."""

from bayesncl.core.methods.common import CONTRASTIVE_STATS, INFO_NCE
from bayesncl.core.methods.registry import register_method
from bayesncl.core.methods.spec import Method

METHOD = register_method(
    Method("ncl", nonneg="rep_relu", terms=(INFO_NCE,), stats=CONTRASTIVE_STATS, doc=__doc__)
)
