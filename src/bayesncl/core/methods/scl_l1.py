"""SCL+L1: the spectral contrastive loss plus β·mean‖z‖₁ of the clipped rows it compares
(``method.beta``): the NCL paper's L1 alternative to non-negativity for spectral CL."""

from bayesncl.core.methods.objective_terms import BETA, L1_CLIPPED, MU, SPECTRAL, paper_method

METHOD = paper_method("scl-l1", __doc__, SPECTRAL, L1_CLIPPED, nonneg="identity", keys=MU | BETA)
