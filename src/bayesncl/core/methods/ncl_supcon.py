"""NCL-SupCon: SupCon on non-negative features z = φ(p), as NCL does with InfoNCE (the NCL paper's
extension of non-negativity to supervised learning). Trained with labels."""

from bayesncl.core.methods.objective_terms import SUPCON, paper_method

METHOD = paper_method("ncl-supcon", __doc__, SUPCON, nonneg="rep_relu", labels=True)
