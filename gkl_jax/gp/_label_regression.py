"""Label regression (LR, Nickisch 2010, Section 4.8): GP classification by regressing the labels.

The labels y_n in {-1, +1} are treated as real targets of GP regression with noise variance sigma_n^2,

    q(f) = N(m, V),   m = (I + sigma_n^2 K^{-1})^{-1} y,   V = (K^{-1} + sigma_n^{-2} I)^{-1}   (Table 4.2),

with sigma_n chosen on a grid in [0.5, 2] to maximise the regression evidence log N(y | 0, K + sigma_n^2 I).
LR is a heuristic, neither a local nor a global approximation of the classification posterior. As in the thesis
(eq. 4.12), its evidence is the Jensen (G-KL) bound of the classification model at q, a valid lower bound on
log Z; predictions use q with the model's own likelihood (`gk.gp.predict`).
"""

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .._bound import bound
from .._model import Model, Sites
from .._result import Result
from ..potentials import Gaussian as GaussianLik
from ..potentials import Logistic, Probit
from ._exact import exact

NOISE_SDS = (0.5, 0.75, 1.0, 1.5, 2.0)


def label_regression(model: Model, noise_sds: Sequence[float] = NOISE_SDS) -> Result:
    """Label regression on a binary classification `model`: GP regression on the labels, its noise chosen on
    a grid (Nickisch 2010, Section 4.8).

    Args:
        model: a `gkl_jax.Model` with a prior and `Sites` with `Logistic` or `Probit` potentials.
        noise_sds: the grid of noise standard deviations sigma_n, positive finite floats (default 0.5 ... 2,
            the range of Nickisch 2010).

    Returns:
        `gkl_jax.Result` with `method="label_regression"` whose `log_z` is the G-KL bound of `model` at the LR
        posterior (Nickisch 2010, eq. 4.12).

    Raises:
        ValueError: model not a Model, without a prior, with other potentials, or a bad noise_sds.
    """
    if not isinstance(model, Model):
        raise ValueError(f"model must be a gkl_jax.Model, got {type(model).__name__}")
    if model.prior is None:
        raise ValueError("label_regression needs a Gaussian prior (model.prior is None)")
    for i, s in enumerate(model.sites):
        if not isinstance(s.potential, (Logistic, Probit)):
            raise ValueError(f"label_regression needs Logistic or Probit sites; sites[{i}] has "
                             f"{type(s.potential).__name__}")
    try:
        sds = np.asarray(noise_sds, dtype=float).reshape(-1)
    except (TypeError, ValueError) as err:
        raise ValueError(f"noise_sds must be positive numbers, got {noise_sds!r}") from err
    if sds.size == 0 or not np.all(np.isfinite(sds)) or np.any(sds <= 0):
        raise ValueError(f"noise_sds must be positive and finite, got {noise_sds!r}")
    regs = []
    for sd in sds:  # a handful of exact regressions sharing one compiled program (the grid is tiny)
        sites = tuple(Sites(s.H, GaussianLik(s.potential.y, float(sd) ** 2), offset=s.offset,
                            variance_offset=s.variance_offset) for s in model.sites)
        regs.append(exact(Model(model.prior, sites)))
    # the best evidence, chosen with array operations so that jit and grad pass through (a NaN never wins)
    evidence = jnp.stack([r.log_z for r in regs])
    winner = jnp.argmax(jnp.where(jnp.isnan(evidence), -jnp.inf, evidence))
    best = jax.tree.map(lambda *leaves: jnp.stack(leaves)[winner], *regs)
    log_z = bound(model, best.q)
    return Result(q=best.q, log_z=log_z, status=best.status, num_steps=best.num_steps,
                  history=jnp.reshape(log_z, (1,)), method="label_regression", is_bound=True)
