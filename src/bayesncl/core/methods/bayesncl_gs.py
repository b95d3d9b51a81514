"""BayesNCL-GS: BayesNCL with the Gumbel-sigmoid gate (a relaxed sample in training, PAPER-NOTES §1)."""

from bayesncl.core.methods.common import CONTRASTIVE_STATS, INFO_NCE
from bayesncl.core.methods.registry import register_method
from bayesncl.core.methods.spec import Method

METHOD = register_method(
    Method("bayesncl-gs", nonneg="rep_relu", gate="gumbel", terms=(INFO_NCE,), stats=CONTRASTIVE_STATS,
           doc=__doc__)
)
