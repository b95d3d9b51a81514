"""SCL: the spectral contrastive loss (HaoChen et al. 2021) on the unconstrained projector output
z = p, rows clipped to norm √μ (``method.mu``): the loss the NCL paper's theory is built on."""

from bayesncl.core.methods.objective_terms import MU, SPECTRAL, stats_for
from bayesncl.core.methods.registry import register_method
from bayesncl.core.methods.spec import Method

METHOD = register_method(
    Method(
        "scl",
        nonneg="identity",
        terms=(SPECTRAL,),
        stats=stats_for(SPECTRAL),
        keys=MU,
        doc=__doc__,
    )
)
