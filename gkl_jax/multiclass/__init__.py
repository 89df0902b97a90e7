"""Multinomial-logit Gaussian-process classification by the variational bound of Chai (2012, JMLR).

C latent functions f^1..f^C share the prior K = K^x (x) K^c + jitter I (a `gk.kernels` kernel on the inputs,
K^c = I by default; the latent vector is datum-major, entry i C + c is f^c(x_i)) and the label of x_i has
probability softmax(f(x_i))_y. The bound log Z_h <= log p(y) (Chai 2012, eq. 21) replaces each expected
log-softmax by the site bound of Theorem 6, with site parameters (b_i, S_i) per datum, and is maximised over
q(f) = N(m, V) and the sites together.

    post = gk.multiclass.fit(gk.kernels.SquaredExponential(1.0, 1.0), X, y)      # y: (n,) ints or one-hot
    pred = gk.multiclass.predict(post, X_new)             # N(m_*, V_*) per test point
    pred.renormalised_probabilities()                     # softmax(m_*) (eq. 25)
    res = gk.multiclass.fit_hyperparameters(kernel, X, y) # ML-II on log Z_h* (Section 6): res.kernel, res.posterior
    res = gk.multiclass.fit_hyperparameters(kernel, X, y, inducing=sites)   # ML-II on the sparse bound (Section 4)
    sel = gk.multiclass.select_inducing(kernel, X, y, 30) # the sparse bound (Section 4) on an active inducing set
    gk.multiclass.GPClassifier().fit(X, y).predict_proba(X_new)   # the scikit-learn-style estimator

Results are Equinox modules: `Posterior` and `SparsePosterior` (log_z, status with its message, converged,
num_steps, history as in `gk.Result`, the site parameters, and the kernel and inputs for `predict`; `fit` and
`fit_sparse` take `progress=` as `gk.fit` does), `HyperResult` (the fields of
`gk.gp.HyperResult` that apply), `Selection` and `Predictive`. Closed-form bounds: `expected_log_softmax_bound`
(Theorem 6 at its optimum), `gram_bound` (Theorem 9), `correlation_bound` (Theorem 10) and
`joint_predictive_bound` (Theorem 12). The solvers on given covariance matrices, the per-site updates, the
comparison bounds, the selection scores and the importance-sampling references are the private modules
`_full`, `_sparse`, `_site`, `_selection`, `_sampling`, `_theory`, `_hyper` (stable for tests and benchmarks).

Why the multinomial-logit site is not a potential of `gk.Model` (issue 36 asked; it cannot be without harm):

- A `gk.Model` site is a potential of one scalar projection h_n^T w: the engine needs E_N(mu, s^2)[log phi] and
  its derivatives in (mu, s^2), by one-dimensional Gauss-Hermite quadrature or in closed form, and its solvers
  (the fixed point, the site-precision Newton step) carry one scalar precision per site. The softmax site is a
  function of a C-dimensional projection f_i = (f^1(x_i), ..., f^C(x_i)) with a C x C block of precisions.
- Its expectation E_N(m_i, V_i)[log softmax(f_i)_y] has no closed form. A product quadrature rule costs p^C
  nodes per site (p per axis), and Monte Carlo makes the objective noisy and no longer a bound.
- Chai's bound is tractable because it replaces that expectation by h(y_i; q_i, b_i, S_i), with C + C(C+1)/2
  further variational parameters per datum maximised jointly with q (the V step needs S_i at its optimum for
  every trial V). The engine optimises (m, C) only; adding per-site auxiliary parameters and vector-valued
  projections would change every factor, solver and warm start of `gk.fit` for one likelihood.
So the multiclass bound keeps its own block-coordinate updates here and shares the engine's pieces: the loop
(`gkl_jax.solvers.iterate`, with its history, status and progress), the backtracking line search
(`gkl_jax._optim.backtrack`), the L-BFGS direction, `gk.kernels`, and the compiled-program options.
"""

from ._api import fit as fit
from ._api import fit_sparse as fit_sparse
from ._api import gram_bound as gram_bound
from ._api import predict as predict
from ._classifier import GPClassifier as GPClassifier
from ._full import Posterior as Posterior
from ._hyper import HyperResult as HyperResult
from ._hyper import fit_hyperparameters as fit_hyperparameters
from ._predict import Predictive as Predictive
from ._predict import joint_predictive_bound as joint_predictive_bound
from ._selection import Selection as Selection
from ._selection import select_inducing as select_inducing
from ._site import expected_log_softmax_bound as expected_log_softmax_bound
from ._sparse import SparsePosterior as SparsePosterior
from ._theory import correlation_bound as correlation_bound

__all__ = [
    "GPClassifier",
    "HyperResult",
    "Posterior",
    "Predictive",
    "Selection",
    "SparsePosterior",
    "correlation_bound",
    "expected_log_softmax_bound",
    "fit",
    "fit_hyperparameters",
    "fit_sparse",
    "gram_bound",
    "joint_predictive_bound",
    "predict",
    "select_inducing",
]
