"""Gaussian-process regression and classification on top of G-KL and the baselines.

- `predict(result, prior, X_new, likelihood=None)`: latent and observation predictives
  (Challis & Barber 2013, App. F.1).
- `exact(model)`: exact GP regression (Gaussian likelihood), the oracle for every approximate method.
- `fit_hyperparameters(build, params, method=...)`: ML-II on any method's evidence (envelope gradients for G-KL).
- `model(kernel, X, likelihood)`: the full GP as a `Model`.
- `sparse_model(kernel, X, Z, likelihood)`: the inducing-point GP as an ordinary `Model`.
- `fit_sparse_minibatch(kernel, X, likelihood, batch_size=..., num_inducing=...)`: the sparse GP fitted by
  stochastic gradients on minibatches (N up to 10^6 in bounded memory), hyperparameters learned jointly;
  `sparse_streamed_bound` / `sparse_minibatch_bound`: its full-data bound streamed in chunks and the unbiased
  minibatch estimate.
- `label_regression(model)`: the label-regression heuristic for GP classification (Nickisch 2010, Section 4.8).
- `ppa(...)`: King & Lawrence's PPA for probit GP classification with the standard or the KL-corrected M-step.
"""

from ._exact import exact as exact
from ._hyper import HyperResult as HyperResult
from ._hyper import fit_hyperparameters as fit_hyperparameters
from ._label_regression import label_regression as label_regression
from ._minibatch import SparseGPFit as SparseGPFit
from ._minibatch import fit_sparse_minibatch as fit_sparse_minibatch
from ._models import model as model
from ._models import sparse_model as sparse_model
from ._models import sparse_projection as sparse_projection
from ._ppa import PPAParams as PPAParams
from ._ppa import PPAResult as PPAResult
from ._ppa import corrected_bound as corrected_bound
from ._ppa import ppa as ppa
from ._ppa import ppa_predict as ppa_predict
from ._ppa import standard_bound as standard_bound
from ._predict import Prediction as Prediction
from ._predict import class_probability as class_probability
from ._predict import latent as latent
from ._predict import log_predictive_density as log_predictive_density
from ._predict import predict as predict
from ._streamed import sparse_minibatch_bound as sparse_minibatch_bound
from ._streamed import sparse_streamed_bound as sparse_streamed_bound
