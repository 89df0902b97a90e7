"""Gaussian-process regression and classification on top of G-KL and the baselines."""
