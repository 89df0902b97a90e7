"""The property tests' extended tier (tests/test_properties.py describes the invariants): GKL_PROPERTY_CASES
(default 200) random cases over random shapes (D 1-30, N 1-300) and every structure, and their transformations
(gradient, vmap, float32). GKL_PROPERTY_TALLY=path appends one JSON line per case (the invariants it checked),
from which benchmarks/README.md counts them."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers_properties import (
    FACTORS,
    LABELS,
    POTENTIALS,
    Case,
    _build,
    _check_float32,
    _check_gradient,
    _check_quadrature,
    _scaled_model,
    check_fit,
    exact_gaussian_evidence,
    quiet_fit,
)

import gkl_jax as gk

P, F = gk.potentials, gk.factors
CASES = int(os.environ.get("GKL_PROPERTY_CASES", "200"))


LOG_CONCAVE = ("gaussian", "logistic", "probit", "poisson", "laplace")
PRIORS = ("isotropic", "diagonal", "dense", "gp")


# ------------------------------------------------------------------------------------------ the extended budget


def _extended_case(i):
    rng = np.random.default_rng(1000 + i)
    potential = POTENTIALS[rng.integers(len(POTENTIALS))]
    prior = PRIORS[rng.integers(len(PRIORS))]
    labels = LABELS[rng.integers(len(LABELS))] if potential in ("logistic", "probit") else "noisy"
    dim = 2 if rng.random() < 0.3 else int(rng.integers(1, 31))
    num_sites = dim if prior == "gp" else int(rng.integers(1, 301))
    return Case(int(rng.integers(1 << 30)), dim, num_sites, potential, prior, labels, bool(rng.integers(2))), \
        FACTORS[rng.integers(len(FACTORS))]


def _record(tally):
    path = os.environ.get("GKL_PROPERTY_TALLY")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(tally) + "\n")


@pytest.mark.extended
@pytest.mark.parametrize("index", range(CASES))
def test_extended_random_case(index):
    """One random case: the fit invariants with its factor (and the Full factor); Full >= it for log-concave
    sites; the quadrature where D = 2; the exact evidence for Gaussian sites."""
    case, factor = _extended_case(index)
    tally = {"case": dataclasses.asdict(case), "factor": factor}
    try:
        case.model()
    except ValueError as err:     # a GP prior of variance up to 1e8 and jitter 1e-6: K + jitter I can be singular
        assert "positive definite" in str(err), err
        _record({**tally, "rejected": 1})
        pytest.skip(f"the drawn model is refused with a ValueError: {err}")
    res = check_fit(case, factor, tally)
    if factor != "full":
        full = check_fit(case, "full")
        if case.potential in LOG_CONCAVE and bool(full.converged) and bool(res.converged):
            assert float(full.log_z) >= float(res.log_z) - 1e-6 * max(1.0, abs(float(full.log_z))), case
            tally["full_dominates"] = 1
        res = full
    if case.dim == 2:
        _check_quadrature(case, res)
        tally["quadrature"] = 1
    if case.potential == "gaussian" and bool(res.converged):   # case 127 (kappa 1.5e13): converged=False, short
        exact = exact_gaussian_evidence(case)
        assert abs(float(res.log_z) - exact) <= 1e-8 * max(1.0, abs(exact)), (case, exact)
        tally["exact_evidence"] = 1
    tally["converged"] = bool(res.converged)
    _record(tally)


@pytest.mark.extended
@pytest.mark.parametrize("index", range(max(1, CASES // 10)))
def test_extended_transformations(index):
    """Random shapes: float32 against float64, `vmap` against the loop and the gradient against differences."""
    rng = np.random.default_rng(5000 + index)
    dim, num_sites = int(rng.integers(1, 11)), int(rng.integers(2, 61))
    potential = ("logistic", "probit", "poisson", "gaussian")[index % 4]
    case = Case(int(rng.integers(1 << 30)), dim, num_sites, potential, "isotropic",
                LABELS[index % 3] if potential in ("logistic", "probit") else "noisy")
    _check_float32(case)
    _check_gradient(case, jax.grad(lambda t, model: gk.fit(_scaled_model(model, t), tol=1e-10).log_z))
    ys = jnp.stack([case.targets()] * 2)
    batched = jax.vmap(lambda y: gk.fit(_build(case, np.float64, y), F.Full()))(ys)
    single = quiet_fit(case.model(), F.Full())
    np.testing.assert_allclose(np.asarray(batched.log_z), float(single.log_z), rtol=1e-9, atol=1e-9)
    _record({"case": dataclasses.asdict(case), "float32": 1, "grad_fd": 1, "vmap": 1})
