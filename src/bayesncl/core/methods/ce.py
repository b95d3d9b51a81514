"""CE: supervised training by the cross-entropy of a linear classifier on the representation z = p
(the projector's output): the NCL paper's supervised baseline. Trained with labels."""

from bayesncl.core.methods.objective_terms import CROSS_ENTROPY, paper_method

METHOD = paper_method("ce", __doc__, CROSS_ENTROPY, nonneg="identity", classifier=True)
