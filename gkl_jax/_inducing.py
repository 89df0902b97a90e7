"""Inducing-point selection shared by the sparse GP estimators (`gkl_jax.sklearn`) and the sparse multinomial GP
classifier (`gkl_jax.multiclass`): k-means++ seeding (Arthur & Vassilvitskii 2007) or a uniform random subset of
the training rows, both seeded, on the host (numpy).

k-means++ picks the first row uniformly and each next row with probability proportional to its squared distance
to the nearest row picked so far, so the inducing inputs spread over the data (dense regions get more, outliers
some) where a random subset leaves gaps; it is the initialisation GPflow's and GPJax's examples use (through
k-means), without the Lloyd iterations, so the inducing inputs are training rows.
"""

import numpy as np

INITS = ("kmeans++", "random")
"""The inducing-row initialisations."""


def inducing_rows(X, k: int, init: str = "kmeans++", random_state=0):
    """k distinct row indices of X chosen by `init`.

    Args:
        X: (n, d) float array of training inputs.
        k: the number of rows, 1 <= k <= n.
        init: "kmeans++" (k-means++ seeding) or "random" (uniform without replacement).
        random_state: None, an int seed or a numpy Generator.

    Returns:
        (k,) sorted int numpy array of distinct row indices.

    Raises:
        ValueError: init not one of `INITS`, or k not an integer in [1, n].
    """
    X = np.asarray(X, np.float64)
    n = X.shape[0]
    if init not in INITS:
        raise ValueError(f"inducing must be one of {INITS}, got {init!r}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n:
        raise ValueError(f"num_inducing must be an integer in [1, n] = [1, {n}] (the number of training rows), "
                         f"got {k!r}")
    rng = random_state if isinstance(random_state, np.random.Generator) else np.random.default_rng(random_state)
    if init == "random" or k == n:
        return np.sort(rng.choice(n, int(k), replace=False))
    chosen = np.empty(int(k), int)
    chosen[0] = rng.integers(n)
    d2 = np.sum((X - X[chosen[0]]) ** 2, axis=1)
    for j in range(1, int(k)):
        total = d2.sum()
        if total <= 0:          # every row coincides with a chosen one: the rest uniformly among the unchosen
            rest = np.setdiff1d(np.arange(n), chosen[:j])
            chosen[j:] = rng.choice(rest, int(k) - j, replace=False)
            break
        chosen[j] = rng.choice(n, p=d2 / total)
        d2 = np.minimum(d2, np.sum((X - X[chosen[j]]) ** 2, axis=1))
    return np.sort(chosen)
