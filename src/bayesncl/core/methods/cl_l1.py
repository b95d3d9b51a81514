"""CL+L1: SimCLR's InfoNCE plus β·mean‖z̃‖₁ (``method.beta``), the NCL paper's L1-regularised CL
baseline (Wang et al. 2024): sparsity asked of the loss instead of given by non-negativity."""

from bayesncl.core.methods.common import INFO_NCE
from bayesncl.core.methods.objective_terms import BETA, L1, stats_for
from bayesncl.core.methods.registry import register_method
from bayesncl.core.methods.spec import Method

METHOD = register_method(
    Method(
        "cl-l1",
        nonneg="identity",
        terms=(INFO_NCE, L1),
        stats=stats_for(INFO_NCE, L1),
        keys=BETA,
        doc=__doc__,
    )
)
