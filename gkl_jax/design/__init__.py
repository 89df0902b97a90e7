"""Bayesian sequential experimental design driven by any fitted Gaussian."""
