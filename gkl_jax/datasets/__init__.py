"""Bundled small data sets (with their attribution) and the papers' synthetic generators."""

from ._synthetic import synthetic_logistic as synthetic_logistic
