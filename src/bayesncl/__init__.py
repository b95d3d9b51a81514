"""bayesncl: interpretable self-supervised learning with NCL and Bayesian gated NCL (BayesNCL)."""

__version__ = "0.1.0"
