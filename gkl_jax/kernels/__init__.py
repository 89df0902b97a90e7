"""Covariance functions for Gaussian-process priors."""
