"""SCL+L1: the spectral contrastive loss plus β·mean‖z‖₁ of the clipped rows it compares
(``method.beta``): the NCL paper's L1 alternative to non-negativity for spectral CL."""

from bayesncl.core.methods.objective_terms import BETA, L1_CLIPPED, MU, SPECTRAL, stats_for
from bayesncl.core.methods.registry import register_method
from bayesncl.core.methods.spec import Method

METHOD = register_method(
    Method(
        "scl-l1",
        nonneg="identity",
        terms=(SPECTRAL, L1_CLIPPED),
        stats=stats_for(SPECTRAL, L1_CLIPPED),
        keys=MU | BETA,
        doc=__doc__,
    )
)
