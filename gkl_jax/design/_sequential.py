"""Bayesian sequential experimental design (Challis & Barber 2013, Section 6.3.2; Nickisch 2010, Alg. 5.1).

    for t = 0 .. steps:
        q_t   = infer(model(M_t, y_t), warm start q_{t-1})          # any method returning a Result
        if t == steps: stop
        M*    = the `per_step` rows maximising the information gain under q_t (free design: greedy leading
                eigenvectors of S by Lanczos; or greedy over a candidate pool; or random unit rows)
        y*    = measure(M*)                                          # the experiment
        M_{t+1} = [M_t; M*],  y_{t+1} = [y_t; y*]

The model is `base_model` with the measurements appended as a Gaussian site group N(y | M w, v^2 I).

Jit once: the measurement block is padded to its final size N_0 + steps * per_step with zero rows whose
Gaussian sites have variance 1/(2 pi). A zero row has h_n^T m = 0 and s_n^2 = 0, so its term
E[log N(0 | h_n^T w, 1/(2 pi))] = -1/2 log(2 pi / (2 pi)) = 0 exactly: the padded model has the same bound,
gradient, posterior and log_z as the unpadded one, and every step reuses the same compiled fit.
"""

import math
import sys
import time
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .._fit import fit
from .._gaussian import Gaussian
from .._linalg import full_precision
from .._model import Model, Sites
from .._result import Result
from .._start import initial_q
from .._validate import as_float_array, check_finite, check_int, check_key, check_ndim
from ..factors import AbstractFactor, Full
from ..operators import AbstractOperator
from ..potentials import Gaussian as GaussianPotential
from ._scores import _candidate_operator, check_noise_variance, greedy_selection, optimal_directions

_PAD_VARIANCE = 1 / (2 * math.pi)


class DesignStep(NamedTuple):
    """One step of the loop: the fit on `num_measurements` rows and the rows designed from it.

    Attributes:
        step: int, the step index (0 is the fit on the initial measurements).
        num_measurements: int, the measurement rows the fit used (padding not counted).
        result: the `gkl_jax.Result` of the fit.
        rows: (per_step, D) float numpy array of designed rows, None at the last step.
        gains: (per_step,) float numpy array of the greedy per-row information gains, None at the last step.
        fit_seconds: float, wall time of the fit (includes compilation at step 0).
        design_seconds: float, wall time of the design.
    """

    step: int
    num_measurements: int
    result: Result
    rows: Optional[np.ndarray]
    gains: Optional[np.ndarray]
    fit_seconds: float
    design_seconds: float


class SequentialDesign(NamedTuple):
    """The outcome of `sequential`.

    Attributes:
        steps: list of `DesignStep`, one per fit (steps + 1).
        measurements: (N, D) float numpy array, the final measurement matrix (unpadded).
        observations: (N,) float numpy array, the observations.
        result: the `gkl_jax.Result` of the last fit.
    """

    steps: list
    measurements: np.ndarray
    observations: np.ndarray
    result: Result


def padded_measurement_sites(M, y, noise_variance, capacity: int) -> Sites:
    """Sites(M_pad, Gaussian(y_pad, v2_pad)) with `capacity` rows; rows past len(y) are inert (module doc).

    Args:
        M: (n, D) finite float array of measurement rows.
        y: (n,) finite float array of observations.
        noise_variance: v^2, a positive finite float scalar.
        capacity: the padded row count (int >= n).

    Returns:
        `gkl_jax.Sites` with a (capacity, D) dense H and a Gaussian potential.

    Raises:
        ValueError: shapes that disagree, non-finite data, a bad noise_variance, or capacity < n.
    """
    M, y = as_float_array(M, "M"), as_float_array(y, "y")
    check_ndim(M, 2, "M")
    n, dim = M.shape
    if y.shape != (n,):
        raise ValueError(f"y must have one entry per row of M, shape ({n},), got {y.shape}")
    check_finite(M, "M")
    check_finite(y, "y")
    v2 = check_noise_variance(noise_variance)
    capacity = check_int(capacity, "capacity", 1)
    if capacity < n:
        raise ValueError(f"capacity={capacity} is smaller than the {n} measurements")
    dtype = jnp.result_type(M, y)
    M_pad = jnp.zeros((capacity, dim), dtype).at[:n].set(M)
    y_pad = jnp.zeros(capacity, dtype).at[:n].set(y)
    var = jnp.full(capacity, _PAD_VARIANCE, dtype).at[:n].set(v2)
    return Sites(M_pad, GaussianPotential(y_pad, var))


def _default_infer(factor):
    def infer(model, q0):
        # step 0 starts where fit would, passed as q0 so that every step runs the same compiled program
        q0 = initial_q(model, factor if factor is not None else Full(), None) if q0 is None else q0
        return fit(model, factor=factor, q0=q0)
    return infer


def _random_rows(key, num, dim):
    R = jax.random.normal(key, (num, dim))
    return R / jnp.linalg.norm(R, axis=1, keepdims=True)


class _Progress:
    def __init__(self, total, enabled, stream=None):
        self.total, self.enabled, self.stream = total, enabled, stream or sys.stderr

    def update(self, rec: DesignStep):
        if not self.enabled:
            return
        width = 24
        done = int(width * (rec.step + 1) / (self.total + 1))
        ok = "ok" if bool(rec.result.converged) else "NOT converged"
        gain = "" if rec.gains is None else f"  gain {float(np.sum(rec.gains)):.3g}"
        line = (f"\r[{'#' * done}{'.' * (width - done)}] step {rec.step}/{self.total}  N={rec.num_measurements}  "
                f"fit {rec.fit_seconds:.2f}s ({ok}){gain}   ")
        end = "\n" if rec.step == self.total else ""
        print(line, end=end, file=self.stream, flush=True)


@full_precision
def sequential(base_model: Model, measure: Callable, M0, y0, noise_variance, *, steps: int, per_step: int = 3,
               infer: Optional[Callable] = None, factor: Optional[AbstractFactor] = None, design="free",
               q0: Optional[Gaussian] = None, callback: Optional[Callable] = None, progress: bool = True,
               key=None, num_vectors: Optional[int] = None, pad: bool = True) -> SequentialDesign:
    """Run the sequential design loop (Challis & Barber 2013, Section 6.3.2; Nickisch 2010, Alg. 5.1; module doc).

    Args:
        base_model: the `gkl_jax.Model` without the measurements (e.g. `Model(None, Sites(B, Laplace(0, tau)))`).
        measure: `measure(rows) -> y*` performs the experiment for a (per_step, D) array of unit-norm rows and
            returns per_step finite observations.
        M0: (N_0, D) float array of initial measurement rows.
        y0: (N_0,) float array of initial observations.
        noise_variance: v^2 > 0, a float scalar.
        steps: design steps (int >= 0); the loop fits steps + 1 times.
        per_step: rows designed per step (int >= 1, default 3).
        infer: `infer(model, q0) -> Result`, the inference method, warm-started from the previous q (None at
            step 0); default `gk.fit(model, factor=factor, q0=q0)`. Baselines plug in the same way, e.g.
            `infer=lambda model, q0: gk.ep(model, power=0.9)`.
        factor: the factor of the default `infer` (not with `infer`).
        design: "free" (default; greedy leading eigenvectors of S, `optimal_directions`), "random" (random unit
            rows), or a candidate pool (a (P, D) array or an operator whose rows are the candidates;
            `greedy_selection`).
        q0: a starting `gkl_jax.Gaussian` for the first fit.
        callback: `callback(step: DesignStep)`, called after every fit.
        progress: print a progress line per step to stderr (default True).
        key: a `jax.random` key for the design (default `jax.random.PRNGKey(0)`).
        num_vectors: Lanczos vectors of the "free" design.
        pad: pad the measurements to their final count with inert zero rows (module doc) so that the fit compiles
            once; pass False for inference methods that cannot take zero rows (a site with zero projected
            variance), at the price of one compilation per step.

    Returns:
        `SequentialDesign`.

    Raises:
        ValueError: bad model, measure, measurements, counts, design or key; both infer and factor; an infer that
            does not return a Result; or a measure that returns the wrong number of values or NaN.
    """
    if not isinstance(base_model, Model):
        raise ValueError(f"base_model must be a gkl_jax.Model, got {type(base_model).__name__}")
    if not callable(measure):
        raise ValueError("measure must be a callable mapping (k, D) rows to k observations")
    v2 = float(check_noise_variance(noise_variance))
    dim = base_model.dim
    M0 = as_float_array(M0, "M0")
    if M0.ndim != 2 or M0.shape[1] != dim:
        raise ValueError(f"M0 must be an (N0, D={dim}) matrix, got shape {M0.shape}")
    check_finite(M0, "M0")
    y0 = as_float_array(y0, "y0")
    if y0.shape != (M0.shape[0],):
        raise ValueError(f"y0 must have shape ({M0.shape[0]},), got {y0.shape}")
    check_finite(y0, "y0")
    steps, per_step = check_int(steps, "steps"), check_int(per_step, "per_step", 1)
    if isinstance(design, str):
        if design not in ("free", "random"):
            raise ValueError(f"design must be 'free', 'random' or a candidate pool, got {design!r}")
        pool = None
    else:
        pool = _candidate_operator(design, dim, "design")
    if infer is None:
        infer = _default_infer(factor)
    elif factor is not None:
        raise ValueError("pass either infer or factor, not both")
    key = jax.random.PRNGKey(0) if key is None else check_key(key)

    M, y = np.asarray(M0), np.asarray(y0)
    capacity = M.shape[0] + steps * per_step
    bar = _Progress(steps, progress)
    records, q = [], q0
    for t in range(steps + 1):
        n_rows = capacity if pad else M.shape[0]
        model = Model(base_model.prior, (padded_measurement_sites(M, y, v2, n_rows),) + base_model.sites)
        start = time.perf_counter()
        res = infer(model, q)
        if not isinstance(res, Result):
            raise ValueError(f"infer must return a gkl_jax.Result, got {type(res).__name__}")
        jax.block_until_ready(res.q.mean)
        fit_seconds = time.perf_counter() - start
        q = res.q
        rows = gains = None
        start = time.perf_counter()
        if t < steps:
            key, sub = jax.random.split(key)
            rows, gains = _design(q, design, pool, per_step, v2, sub, num_vectors)
            rows, gains = np.asarray(rows), np.asarray(gains)
        design_seconds = time.perf_counter() - start
        rec = DesignStep(t, int(M.shape[0]), res, rows, gains, fit_seconds, design_seconds)
        records.append(rec)
        bar.update(rec)
        if callback is not None:
            callback(rec)
        if rows is not None:
            y_new = np.asarray(measure(rows), dtype=float).reshape(-1)
            if y_new.shape != (per_step,):
                raise ValueError(f"measure must return {per_step} observations, got shape {y_new.shape}")
            if not np.all(np.isfinite(y_new)):
                raise ValueError(f"measure returned NaN or inf at step {t}: {y_new}")
            M, y = np.concatenate([M, rows]), np.concatenate([y, y_new])
    return SequentialDesign(records, M, y, records[-1].result)


def _design(q, design, pool: Optional[AbstractOperator], num, v2, key, num_vectors):
    if pool is not None:
        idx, gains = greedy_selection(q, pool, num, v2)
        E = jnp.zeros((pool.shape[0], num), q.mean.dtype).at[idx, jnp.arange(num)].set(1.0)
        return pool.rmm(E).T, gains
    if design == "random":
        rows = _random_rows(key, num, q.dim).astype(q.mean.dtype)
        Z = jax.vmap(q.factor.matvec)(rows)
        return rows, 0.5 * jnp.log1p(jnp.sum(jnp.square(Z), axis=1) / v2)
    return optimal_directions(q, num, v2, num_vectors=num_vectors, key=key)
