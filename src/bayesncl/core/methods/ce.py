"""CE: supervised training by the cross-entropy of a linear classifier on the representation z = p
(the projector's output): the NCL paper's supervised baseline. Trained with labels."""

from bayesncl.core.methods.objective_terms import CLASSIFIER, CROSS_ENTROPY, stats_for
from bayesncl.core.methods.registry import register_method
from bayesncl.core.methods.spec import Method

METHOD = register_method(
    Method(
        "ce",
        nonneg="identity",
        terms=(CROSS_ENTROPY,),
        stats=stats_for(CROSS_ENTROPY, head=True),
        needs_labels=True,
        heads=CLASSIFIER,
        doc=__doc__,
    )
)
