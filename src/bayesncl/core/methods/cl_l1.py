"""CL+L1: SimCLR's InfoNCE plus β·mean‖z̃‖₁ (``method.beta``), the NCL paper's L1-regularised CL
baseline (Wang et al. 2024): sparsity asked of the loss instead of given by non-negativity."""

from bayesncl.core.methods.common import INFO_NCE
from bayesncl.core.methods.objective_terms import BETA, L1, paper_method

METHOD = paper_method("cl-l1", __doc__, INFO_NCE, L1, nonneg="identity", keys=BETA)
