"""SCL: the spectral contrastive loss (HaoChen et al. 2021) on the unconstrained projector output
z = p, rows clipped to norm √μ (``method.mu``): the loss the NCL paper's theory is built on."""

from bayesncl.core.methods.objective_terms import MU, SPECTRAL, paper_method

METHOD = paper_method("scl", __doc__, SPECTRAL, nonneg="identity", keys=MU)
