"""Multinomial-logit Gaussian-process classification (Chai, 2012)."""
