"""NCE: the NCL paper's Non-negative Cross Entropy: CE's classifier on non-negative features
z = φ(p). Only the features are constrained: each class score is a signed linear combination of
non-negative activations (the classifier's weights are free, docs/paper-notes.md §6)."""

from bayesncl.core.methods.objective_terms import CLASSIFIER, CROSS_ENTROPY, stats_for
from bayesncl.core.methods.registry import register_method
from bayesncl.core.methods.spec import Method

METHOD = register_method(
    Method(
        "nce",
        nonneg="rep_relu",
        terms=(CROSS_ENTROPY,),
        stats=stats_for(CROSS_ENTROPY, head=True),
        needs_labels=True,
        heads=CLASSIFIER,
        doc=__doc__,
    )
)
