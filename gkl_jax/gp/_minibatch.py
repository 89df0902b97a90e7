"""Minibatch fits of sparse GPs to large N: G-KL on the whitened inducing values with an unbiased minibatch
estimate of the site sum, any optax optimiser, and the kernel (and optionally the inducing inputs and the
likelihood's positive scalar parameters) learned jointly (Hensman et al. 2015, with the G-KL bound of Challis &
Barber 2013, eq. 7).

Each step draws B of the N data rows (without replacement within an epoch: a fresh permutation every N // B
steps), forms the whitened sites of those rows only (`_streamed.batch_sites`: O(B M) memory) and follows the
gradient of -B_hat, B_hat = H[q] + E_q[log N(v | 0, I)] + (N / B) sum_{n in b} I_n, an unbiased estimate of the
bound and of its gradient in (m, C, kernel, Z, likelihood). The fit ends with one streamed pass over all N rows
(`sparse_streamed_bound`) that gives the exact bound at the final parameters and its gradient, from which
`converged` is decided. Memory is O(N d + M^2 + (B + chunk) M) whatever N.
"""

import dataclasses
import functools
import warnings
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax import lax
from jaxtyping import ArrayLike, Float

from .._gaussian import Gaussian
from .._linalg import full_precision
from .._program import program
from .._progress import report_done, report_step, reraise_callback_error, resolve_progress
from .._result import Result
from .._status import RESULTS
from .._typing import Inputs, Key, ScalarLike
from .._validate import check_int, check_key, check_max_steps, check_tol, is_concrete
from .._whiten import unwhitened_q
from ..factors import Full
from ..kernels import AbstractKernel
from ..potentials import AbstractPotential, Custom
from ..priors import GP
from ..solvers import ProgressInfo
from ..stochastic import take_sites
from ._models import inputs
from ._streamed import (
    DEFAULT_CHUNK,
    batch_sites,
    check_data,
    inducing_prior,
    site_rows,
    sparse_minibatch_bound,
    sparse_streamed_bound,
)

TRACE_COUNT = {"fit_sparse_minibatch": 0}


class SparseGPFit(eqx.Module):
    """A minibatch sparse GP fit.

    Predict with `gp.predict(fit.result, fit.prior, X_new, likelihood)` (q is over the inducing values).

    Attributes:
        result: `gkl_jax.Result` with q over u = f(Z) (a Full factor), `log_z` the full-data bound at the final
            parameters (streamed), `converged`, `num_steps` and `history` ((num_steps + 1,): the minibatch
            estimates B_hat at each step, then the full-data bound).
        prior: the `gkl_jax.priors.GP` over Z with the fitted kernel (and inducing inputs).
        likelihood: the likelihood with its fitted parameters (and the training targets).
        q_whitened: the `gkl_jax.Gaussian` over the whitened inducing values v (u = mu_Z + L v).
        grad_max: float scalar array, max |dB/dtheta| over every optimised parameter at the end (full data).
    """

    result: Result
    prior: GP
    likelihood: AbstractPotential
    q_whitened: Gaussian
    grad_max: jax.Array

    @property
    def kernel(self):
        return self.prior.kernel

    @property
    def Z(self):
        return self.prior.X


@functools.lru_cache(maxsize=64)
def _default_optimizer(num_steps: int, learning_rate: float):
    """Adam with a cosine decay to learning_rate / 100 (cached: the same object compiles once)."""
    return optax.adam(optax.cosine_decay_schedule(learning_rate, num_steps, alpha=1e-2))


def _learnable_likelihood(likelihood, learn):
    """The filter of the likelihood's learned leaves: with learn=True its scalar inexact parameters other than the
    targets (noise variance, scales, degrees of freedom: all positive, learned on the log scale; none for
    `Custom`), with False none, with a tuple of names those of its scalar parameters (ValueError naming
    learn_likelihood for any other value)."""
    none = jax.tree.map(lambda _: False, likelihood)
    if learn is False or isinstance(likelihood, Custom):
        return none
    if learn is True:
        spec = jax.tree.map(lambda x: eqx.is_inexact_array(x) and x.ndim == 0, likelihood)
        if getattr(likelihood, "y", None) is not None:
            spec = eqx.tree_at(lambda p: p.y, spec, False)
        return spec
    names = (learn,) if isinstance(learn, str) else learn
    if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"learn_likelihood must be True, False or a tuple of parameter names, got {learn!r}")
    scalar = [f.name for f in dataclasses.fields(likelihood) if f.name != "y"
              and eqx.is_inexact_array(getattr(likelihood, f.name)) and getattr(likelihood, f.name).ndim == 0]
    unknown = [n for n in names if n not in scalar]
    if unknown:
        raise ValueError(f"learn_likelihood names {unknown}, not scalar parameters of {type(likelihood).__name__} "
                         f"(those are {scalar})")
    for name in names:
        none = eqx.tree_at(lambda p, name=name: getattr(p, name), none, True)
    return none


def _inducing(X, Z, num_inducing, key):
    """Z given, or `num_inducing` distinct rows of X drawn with `key`."""
    n = X.shape[0]
    if Z is not None:
        if num_inducing is not None and check_int(num_inducing, "num_inducing", 1) != jnp.shape(Z)[0]:
            raise ValueError(f"num_inducing={num_inducing} but Z has {jnp.shape(Z)[0]} rows; give one of them")
        return Z
    if num_inducing is None:
        raise ValueError("give the inducing inputs Z or their number num_inducing")
    m = check_int(num_inducing, "num_inducing", 1)
    if m > n:
        raise ValueError(f"num_inducing must be between 1 and N = {n}, got {m}")
    return X[jax.random.permutation(key, n)[:m]]


@full_precision
def fit_sparse_minibatch(kernel: AbstractKernel, X: Inputs, likelihood: AbstractPotential, *, batch_size: int,
                         Z: Float[ArrayLike, "m d"] | None = None,
                         num_inducing: int | None = None, num_steps: int | None = None,
                         num_epochs: float | None = None, optimizer: optax.GradientTransformation | None = None,
                         learning_rate: float = 3e-2, learn_kernel: bool = True, learn_inducing: bool = False,
                         learn_likelihood: bool | tuple[str, ...] = True, mean: ScalarLike = 0.0,
                         jitter: float = 1e-6, key: Key | None = None, chunk_size: int | None = None,
                         tol: float | None = None,
                         progress: bool | str | Callable[[ProgressInfo], object] = False) -> SparseGPFit:
    """Fit a sparse GP to N data rows by stochastic gradients of the G-KL bound on minibatches of B rows.

    q(v) = N(m, C^T C) over the whitened inducing values v (u = mu_Z + L v), started at the prior mean with
    variances 1 / Lambda_jj (a minibatch estimate of the diagonal of the fixed-point precision, Challis & Barber
    2013, eq. 10); the optimiser sees C in units of their geometric mean, so one step size suits m, C and the
    log-hyperparameters. Compiled once per (shapes, batch size, num_steps, optimiser, learned parts).

    Convergence: the final streamed pass gives the full-data gradient g of the bound in every optimised parameter
    (m, C, the kernel's log-parameters, Z, the likelihood's log-parameters); `converged` is
    max|g| / N <= tol, the bound finite and no step skipped for a non-finite gradient estimate; otherwise a
    warning says so.

    Args:
        kernel: a `gkl_jax.kernels` kernel (the starting hyperparameters).
        X: (N, d) float array of inputs (an (N,) array is read as d = 1).
        likelihood: a `gkl_jax.potentials` potential with N sites (e.g. `Logistic(y)`, `Gaussian(y, 0.1)`).
        batch_size: rows per step B, 1 <= B <= N.
        Z: (M, d) float array of inducing inputs, or None to draw `num_inducing` rows of X.
        num_inducing: M when Z is None, 1 <= M <= N.
        num_steps: optimiser steps (give exactly one of num_steps and num_epochs).
        num_epochs: passes over the data (a positive float): round(num_epochs * N / B) steps.
        optimizer: any `optax.GradientTransformation` (it minimises -B_hat); default Adam with a cosine decay from
            `learning_rate` to `learning_rate / 100`. Pass the same object again to reuse the compiled program.
        learning_rate: the default optimiser's initial step size (default 3e-2).
        learn_kernel: learn the kernel's (log-)parameters (default True).
        learn_inducing: learn Z (default False).
        learn_likelihood: learn the likelihood's positive scalar parameters on the log scale: True (default; all
            of them, `Custom` potentials have none), False, or a tuple of their names (e.g. ("scale",): a
            Student-t's scale learned, its dof fixed).
        mean: the constant prior mean c (default 0).
        jitter: added to K_zz's diagonal (default 1e-6).
        key: PRNG key for the inducing inputs and the batches (default `jax.random.key(0)`).
        chunk_size: rows per chunk of the final streamed pass (default 4096).
        tol: per-datum gradient tolerance for `converged` (default 1e-2).
        progress: False (default), True (on stderr: the step, the minibatch estimate of the bound and
            max|gradient estimate| / N, every ceil(num_steps / 100) steps at most once a second, then the
            full-data bound and max|grad| / N), "auto" (True where stderr is a terminal) or a callable receiving
            a `gkl_jax.solvers.ProgressInfo` (solver "minibatch") at those steps and once at the end, as in
            `gkl_jax.fit`. Turning it on compiles the fit once more. A callable that raises stops the fit with
            its exception.

    Returns:
        `SparseGPFit`.

    Raises:
        ValueError: a bad kernel, X, likelihood or Z (wrong width, more rows than X), num_inducing < 1 or > N,
            batch_size < 1 or > N, both or neither of num_steps/num_epochs, optimizer not an optax
            transformation, a mean that is not a scalar, learn_likelihood with a non-positive likelihood
            parameter or a name that is not a scalar parameter, or a progress that is not True, False, "auto" or
            callable.
    """
    callback = resolve_progress(progress, "gkl_jax.gp.fit_sparse_minibatch")
    key = jax.random.key(0) if key is None else check_key(key)
    z_key, fit_key = jax.random.split(key)
    X = inputs(X, "X")
    Z = _inducing(X, Z, num_inducing, z_key)
    X, Z = check_data(kernel, X, Z, likelihood)
    n = X.shape[0]
    b = check_int(batch_size, "batch_size", 1)
    if b > n:
        raise ValueError(f"batch_size must be between 1 and N = {n}, got {b}")
    if (num_steps is None) == (num_epochs is None):
        raise ValueError("pass exactly one of num_steps and num_epochs")
    if num_epochs is not None:
        num_steps = max(1, int(round(check_tol(num_epochs, "num_epochs") * n / b)))
    num_steps = check_max_steps(num_steps, "num_steps")
    if optimizer is None:
        optimizer = _default_optimizer(num_steps, check_tol(learning_rate, "learning_rate"))
    elif not isinstance(optimizer, optax.GradientTransformation):
        raise ValueError(f"optimizer must be an optax.GradientTransformation, got {type(optimizer).__name__}")
    lik_spec = _learnable_likelihood(likelihood, learn_likelihood)
    lik_dyn = eqx.filter(likelihood, lik_spec)
    if any(is_concrete(x) and not bool(x > 0) for x in jax.tree.leaves(lik_dyn)):
        raise ValueError("learn_likelihood learns the likelihood's scalar parameters on the log scale; they "
                         "must be positive (or pass learn_likelihood=False)")
    tol = 1e-2 if tol is None else check_tol(tol)
    if jnp.ndim(mean) != 0:
        raise ValueError(f"mean must be a scalar (the constant prior mean), got shape {jnp.shape(mean)}")
    mean = jnp.asarray(mean, X.dtype)
    kernel_spec = jax.tree.map(eqx.is_inexact_array if learn_kernel else (lambda _: False), kernel)
    spec = (kernel_spec, bool(learn_inducing), lik_spec)
    chunk = DEFAULT_CHUNK if chunk_size is None else check_int(chunk_size, "chunk_size", 1)
    try:
        fit = _fit_jit((kernel, Z, likelihood), X, mean, fit_key, spec, optimizer, b, num_steps, float(jitter),
                       chunk, callback)
    except jax.errors.JaxRuntimeError as e:     # a progress callable that raised: its own exception
        reraise_callback_error(callback, e)
        raise
    q_v, log_z, grad_max, bad, history, (kernel, Z, likelihood) = fit
    prior = inducing_prior(kernel, Z, mean, float(jitter))
    converged = (grad_max / n <= tol) & jnp.isfinite(log_z) & (bad == 0)
    if callback is not None:
        code = jnp.where(converged, RESULTS.successful,
                         jnp.where(jnp.isfinite(log_z), RESULTS.max_steps_reached, RESULTS.nonfinite))
        report_done(callback, "minibatch", num_steps, log_z, grad_max / n, code)
    if is_concrete(converged) and not bool(converged):
        why = f"{int(bad)} steps had a non-finite gradient estimate and were skipped; " if int(bad) else ""
        warnings.warn(f"gkl_jax.gp.fit_sparse_minibatch: after {num_steps} steps {why}the full-data gradient has "
                      f"max|grad|/N = {float(grad_max) / n:.3g} > tol={tol:g}; the result is a valid bound but not "
                      "the optimum (more steps or epochs, or a smaller learning rate)", stacklevel=2)
    q_u = unwhitened_q(q_v, prior.chol, prior.mean)
    result = Result(q=q_u, log_z=log_z, converged=converged, num_steps=jnp.asarray(num_steps), history=history,
                    method="gkl-sparse-minibatch")
    return SparseGPFit(result=result, prior=prior, likelihood=likelihood, q_whitened=q_v, grad_max=grad_max)


def _start(kernel, Z, likelihood, X, mean, jitter, idx):
    """Mean 0 and the standard deviations 1 / sqrt(Lambda_jj) of the start, Lambda = I + (N / B) A_b Gamma A_b^T
    estimated on the batch idx at q = N(0, I), Gamma_n = -2 dI_n / d(s_n^2) (Challis & Barber 2013, eq. 10)."""
    n, m = X.shape[0], Z.shape[0]
    prior_u = inducing_prior(kernel, Z, mean, jitter)
    part = take_sites(site_rows(likelihood), idx, n).potential
    sites = batch_sites(kernel, prior_u, X[idx], part)
    fm, s2 = sites.project(Gaussian(jnp.zeros(m, X.dtype), Full(jnp.eye(m, dtype=X.dtype))))
    gamma = -2 * jax.grad(lambda v: jnp.sum(sites.potential.expected_log_phi(fm, v)))(s2)
    lam = 1.0 + (n / idx.shape[0]) * sites.operator(m).sq_rmv(jnp.maximum(gamma, 0.0))
    lam = jnp.where(jnp.isfinite(lam), lam, 1.0)
    return 1 / jnp.sqrt(lam)


@program
def _fit_jit(hyper0, X, mean, key, spec, optimizer, b, num_steps, jitter, chunk, progress=None):
    TRACE_COUNT["fit_sparse_minibatch"] += 1
    n = X.shape[0]
    kernel_spec, learn_z, lik_spec = spec
    dyn0, static = eqx.partition(hyper0, (kernel_spec, learn_z, lik_spec))
    dyn0 = (dyn0[0], dyn0[1], jax.tree.map(jnp.log, dyn0[2]))
    key, start_key = jax.random.split(key)
    std = _start(*hyper0, X, mean, jitter, jax.random.permutation(start_key, n)[:b])
    scale = jnp.exp(jnp.mean(jnp.log(std)))
    m0 = jnp.zeros_like(std)
    phi0 = {"mean": m0, "C": jnp.diag(std) / scale, "hyper": dyn0}

    def unpack(phi):
        d = phi["hyper"]
        hyper = eqx.combine((d[0], d[1], jax.tree.map(jnp.exp, d[2])), static)
        return Gaussian(phi["mean"], Full(scale * jnp.triu(phi["C"]))), hyper

    def loss(phi, idx):
        q, (kernel, Z, lik) = unpack(phi)
        return -sparse_minibatch_bound(kernel, X, Z, lik, q, idx, mean=mean, jitter=jitter)

    value_and_grad = jax.value_and_grad(loss)
    per_epoch = n // b

    def step(carry, k):
        phi, opt_state, perm, key, bad = carry
        key, sub = jax.random.split(key)
        pos = k % per_epoch
        perm = lax.cond(pos == 0, lambda kk: jax.random.permutation(kk, perm), lambda kk: perm, sub)
        v, g = value_and_grad(phi, lax.dynamic_slice_in_dim(perm, pos * b, b))
        ok = jnp.isfinite(v) & jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(g)]))
        g = jax.tree.map(lambda x: jnp.where(ok, x, 0.0), g)
        updates, new_state = optimizer.update(g, opt_state, phi)
        new_phi = optax.apply_updates(phi, updates)
        ok = ok & jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(new_phi)]))
        phi = jax.tree.map(lambda a, c: jnp.where(ok, a, c), new_phi, phi)
        opt_state = jax.tree.map(lambda a, c: jnp.where(ok, a, c), new_state, opt_state)
        if progress is not None:
            statistic = jnp.max(jnp.array([jnp.max(jnp.abs(x)) for x in jax.tree.leaves(g)])) / n
            report_step(progress, "minibatch", k, num_steps, -v, statistic)
        return (phi, opt_state, perm, key, bad + (~ok).astype(jnp.int32)), -v

    carry0 = (phi0, optimizer.init(phi0), jnp.arange(n, dtype=jnp.int32), key, jnp.zeros((), jnp.int32))
    (phi, _, _, _, bad), estimates = lax.scan(step, carry0, jnp.arange(num_steps))

    def full(theta):
        (mu, C), d = theta
        kernel, Z, lik = eqx.combine((d[0], d[1], jax.tree.map(jnp.exp, d[2])), static)
        return sparse_streamed_bound(kernel, X, Z, lik, Gaussian(mu, Full(C)), mean=mean, jitter=jitter,
                                     chunk_size=chunk)

    q, hyper = unpack(phi)
    theta = ((q.mean, q.factor.upper()), phi["hyper"])
    log_z, grad = jax.value_and_grad(full)(theta)
    grad_max = jnp.max(jnp.array([jnp.max(jnp.abs(x)) for x in jax.tree.leaves(grad)]))
    history = jnp.concatenate([estimates.astype(log_z.dtype), log_z[None]])
    return q, log_z, grad_max, bad, history, hyper
