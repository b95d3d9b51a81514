"""NCL-SCL: the spectral contrastive loss on non-negative features z = φ(p), as NCL does with
InfoNCE: the NCL paper's non-negative spectral CL (its equivalence to symmetric NMF)."""

from bayesncl.core.methods.objective_terms import MU, SPECTRAL, stats_for
from bayesncl.core.methods.registry import register_method
from bayesncl.core.methods.spec import Method

METHOD = register_method(
    Method(
        "ncl-scl",
        nonneg="rep_relu",
        terms=(SPECTRAL,),
        stats=stats_for(SPECTRAL),
        keys=MU,
        doc=__doc__,
    )
)
