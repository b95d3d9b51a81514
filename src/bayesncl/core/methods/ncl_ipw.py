"""NCL-IPW: NCL on the inverse-prevalence similarity of Definition 4.4: InfoNCE on normalize(z ⊙ π^(-1/2)),
π an EMA of each dimension's activation frequency (:class:`bayesncl.core.parts.Prevalence`)."""

from bayesncl.core.methods.common import CONTRASTIVE_STATS, INFO_NCE
from bayesncl.core.methods.registry import register_method
from bayesncl.core.methods.spec import Method

METHOD = register_method(
    Method("ncl-ipw", nonneg="rep_relu", ipw=True, terms=(INFO_NCE,), stats=CONTRASTIVE_STATS, doc=__doc__)
)
