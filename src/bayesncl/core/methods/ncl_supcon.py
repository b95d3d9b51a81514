"""NCL-SupCon: SupCon on non-negative features z = φ(p), as NCL does with InfoNCE (the NCL paper's
extension of non-negativity to supervised learning). Trained with labels."""

from bayesncl.core.methods.objective_terms import SUPCON, stats_for
from bayesncl.core.methods.registry import register_method
from bayesncl.core.methods.spec import Method

METHOD = register_method(
    Method(
        "ncl-supcon",
        nonneg="rep_relu",
        terms=(SUPCON,),
        stats=stats_for(SUPCON),
        needs_labels=True,
        doc=__doc__,
    )
)
