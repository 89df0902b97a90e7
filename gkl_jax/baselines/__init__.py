"""Classic deterministic Gaussian approximations on the same Model: Laplace, EP, local bounds, the double loop, AIS."""
