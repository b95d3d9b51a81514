"""NCE: the NCL paper's Non-negative Cross Entropy: CE's classifier on non-negative features
z = φ(p). Only the features are constrained: each class score is a signed linear combination of
non-negative activations (the classifier's weights are free, docs/paper-notes.md §6)."""

from bayesncl.core.methods.objective_terms import CROSS_ENTROPY, paper_method

METHOD = paper_method("nce", __doc__, CROSS_ENTROPY, nonneg="rep_relu", classifier=True)
