"""Multinomial-logit Gaussian-process classification by the variational bound of Chai (2012, JMLR).

Functional core (datum-major nC-vectors; K is the (nC, nC) prior covariance, Y the (n, C) one-hot labels):

- per datum: `site_bound` (Theorem 6, eq. 19), `optimise_site` (b fixed point / Newton, S by eq. 61),
  the comparison bounds `jensen_bound` (eqs. 9-10), `knowles_minka_bound`, `softmax_upper_bound` (Lemma 7) and
  `expected_log_softmax_mc`;
- the bound `log_z_h` (eq. 21) and its maximiser `fit_full` (site="theorem6" | "knowles_minka",
  covariance="full" | "class_factorised", v_update="newton" | "fixed_point");
- data-independent bounds `lemma29_value`, `theorem9_bound`, `theorem10_bound`;
- prediction `predictive_moments` -> `Predictive` (eq. 25 probabilities, eq. 24 bounds), `theorem12_bound`;
- reference values by importance sampling (App. F): `importance_sampling`, `importance_predictive`;
- model learning `fit_hyperparameters` (Section 6) with `prior_covariance`;
- the sparse approximation (Section 4): `inducing_prior`, `fit_sparse`, `sparse_log_z` (eq. 32),
  `sparse_hyper_gradient` (App. C.4); inducing-set selection (Section 6.1, App. D): `selection_scores`
  (d_1, d_2, d_3), `select_inducing` (active or random, optionally alternating with `hyper_ascent`, the
  hyper-parameter line searches of Table 5) -> `Selection`;
- `GPClassifier`, the scikit-learn-style estimator.
"""

from ._classifier import GPClassifier as GPClassifier
from ._full import FullPosterior as FullPosterior
from ._full import fit_full as fit_full
from ._full import log_z_h as log_z_h
from ._hyper import HyperResult as HyperResult
from ._hyper import fit_hyperparameters as fit_hyperparameters
from ._hyper import prior_covariance as prior_covariance
from ._predict import Predictive as Predictive
from ._predict import predictive_moments as predictive_moments
from ._predict import theorem12_bound as theorem12_bound
from ._sampling import ImportanceEstimate as ImportanceEstimate
from ._sampling import importance_predictive as importance_predictive
from ._sampling import importance_sampling as importance_sampling
from ._selection import Selection as Selection
from ._selection import hyper_ascent as hyper_ascent
from ._selection import inducing_prior as inducing_prior
from ._selection import select_inducing as select_inducing
from ._selection import selection_scores as selection_scores
from ._selection import sparse_hyper_gradient as sparse_hyper_gradient
from ._site import SiteOptimum as SiteOptimum
from ._site import expected_log_softmax_mc as expected_log_softmax_mc
from ._site import jensen_bound as jensen_bound
from ._site import knowles_minka_bound as knowles_minka_bound
from ._site import max_site_bound as max_site_bound
from ._site import optimise_site as optimise_site
from ._site import s_fixed_point as s_fixed_point
from ._site import site_bound as site_bound
from ._site import site_statistics as site_statistics
from ._site import softmax_upper_bound as softmax_upper_bound
from ._sparse import SparsePosterior as SparsePosterior
from ._sparse import fit_sparse as fit_sparse
from ._sparse import sparse_log_z as sparse_log_z
from ._theory import lemma29_value as lemma29_value
from ._theory import theorem9_bound as theorem9_bound
from ._theory import theorem10_bound as theorem10_bound
