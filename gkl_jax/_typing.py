"""Type aliases of the public signatures (internal API, not part of the public interface).

Arrays are annotated with jaxtyping (dtype and named dimensions, e.g. `Float[ArrayLike, "n d"]`: n rows of d
columns). The annotations document the signatures and serve static checkers; nothing checks them at run time
(the functions validate their inputs themselves and raise ValueError naming the argument).
"""

import os

from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

Scalar = Float[Array, ""]
"""A float scalar array (a bound, a log Z)."""
ScalarLike = float | Float[ArrayLike, ""]
"""A float, or a float scalar array (possibly traced)."""
Inputs = Float[ArrayLike, "n d"] | Float[ArrayLike, " n"]
"""GP inputs: n rows of d features, or an (n,) array read as d = 1."""
Means = float | Float[ArrayLike, " n"]
"""A constant, or one value per row (n,)."""
Indices = Int[ArrayLike, " b"]
"""Row indices."""
Key = PRNGKeyArray
"""A JAX random key (`jax.random.key(0)` or `jax.random.PRNGKey(0)`)."""
Path = str | os.PathLike
"""A file path."""
