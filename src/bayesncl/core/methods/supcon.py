"""SupCon: the supervised contrastive loss (Khosla et al. 2020) on z̃ = normalize(p): every other
view with the same label, anywhere in the global batch, is a positive. Trained with labels."""

from bayesncl.core.methods.objective_terms import SUPCON, paper_method

METHOD = paper_method("supcon", __doc__, SUPCON, nonneg="identity", labels=True)
