"""NCL+L1: NCL (InfoNCE on z = φ(p)) plus β·mean‖z̃‖₁ (``method.beta``): what an explicit L1 adds to
the sparsity non-negativity gives."""

from bayesncl.core.methods.common import INFO_NCE
from bayesncl.core.methods.objective_terms import BETA, L1, paper_method

METHOD = paper_method("ncl-l1", __doc__, INFO_NCE, L1, nonneg="rep_relu", keys=BETA)
