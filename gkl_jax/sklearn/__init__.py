"""scikit-learn estimators on G-KL inference (needs the optional extra: pip install gkl-jax[sklearn]).

    from gkl_jax.sklearn import BayesianLogisticRegression, BayesianRegression, GPClassifier, GPRegressor
    from gkl_jax.sklearn import MulticlassGPClassifier

- `BayesianLogisticRegression`: calibrated probabilities by the predictive integral, coef_std_, log_evidence_;
  one-vs-rest for more than two classes.
- `BayesianRegression(likelihood="gaussian" | "student-t" | "laplace")`: (robust) Bayesian linear regression.
- `GPClassifier` (binary; one-vs-rest beyond) and `GPRegressor` on `gkl_jax.gp`, kernel hyperparameters by ML-II.
- `MulticlassGPClassifier`: the multinomial-logit GP classifier of `gkl_jax.multiclass` (Chai 2012) as an
  estimator.

Every estimator computes in float64 (a local `jax.enable_x64` context), whatever the global JAX setting, and
returns numpy arrays.
"""

try:
    import sklearn as _sklearn  # noqa: F401
except ImportError as _err:  # pragma: no cover - exercised without scikit-learn installed
    raise ImportError("gkl_jax.sklearn needs scikit-learn (>= 1.4), an optional dependency: "
                      "pip install 'gkl-jax[sklearn]' (or pip install scikit-learn)") from _err

from ._gp import GPClassifier as GPClassifier
from ._gp import GPRegressor as GPRegressor
from ._gp_multiclass import MulticlassGPClassifier as MulticlassGPClassifier
from ._linear import BayesianLogisticRegression as BayesianLogisticRegression
from ._linear import BayesianRegression as BayesianRegression

__all__ = ["BayesianLogisticRegression", "BayesianRegression", "GPClassifier", "GPRegressor",
           "MulticlassGPClassifier"]
