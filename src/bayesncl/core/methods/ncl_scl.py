"""NCL-SCL: the spectral contrastive loss on non-negative features z = φ(p), as NCL does with
InfoNCE: the NCL paper's non-negative spectral CL (its equivalence to symmetric NMF)."""

from bayesncl.core.methods.objective_terms import MU, SPECTRAL, paper_method

METHOD = paper_method("ncl-scl", __doc__, SPECTRAL, nonneg="rep_relu", keys=MU)
