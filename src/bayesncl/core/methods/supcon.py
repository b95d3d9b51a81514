"""SupCon: the supervised contrastive loss (Khosla et al. 2020) on z̃ = normalize(p): every other
view with the same label, anywhere in the global batch, is a positive. Trained with labels."""

from bayesncl.core.methods.objective_terms import SUPCON, stats_for
from bayesncl.core.methods.registry import register_method
from bayesncl.core.methods.spec import Method

METHOD = register_method(
    Method(
        "supcon",
        nonneg="identity",
        terms=(SUPCON,),
        stats=stats_for(SUPCON),
        needs_labels=True,
        doc=__doc__,
    )
)
