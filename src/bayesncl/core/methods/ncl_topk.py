"""NCL+TopK: NCL keeping the k = round(ρ·D) largest entries of z (the papers' TopK baseline)."""

from bayesncl.core.methods.common import CONTRASTIVE_STATS, INFO_NCE
from bayesncl.core.methods.registry import register_method
from bayesncl.core.methods.spec import Method

METHOD = register_method(
    Method("ncl-topk", nonneg="rep_relu", topk=True, terms=(INFO_NCE,), stats=CONTRASTIVE_STATS, doc=__doc__)
)
