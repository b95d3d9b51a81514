"""NCL+L1: NCL (InfoNCE on z = φ(p)) plus β·mean‖z̃‖₁ (``method.beta``): what an explicit L1 adds to
the sparsity non-negativity gives."""

from bayesncl.core.methods.common import INFO_NCE
from bayesncl.core.methods.objective_terms import BETA, L1, stats_for
from bayesncl.core.methods.registry import register_method
from bayesncl.core.methods.spec import Method

METHOD = register_method(
    Method(
        "ncl-l1",
        nonneg="rep_relu",
        terms=(INFO_NCE, L1),
        stats=stats_for(INFO_NCE, L1),
        keys=BETA,
        doc=__doc__,
    )
)
