"""Gaussian priors N(w | mu, Sigma)."""

from ._gp import GP as GP
from ._priors import AbstractPrior as AbstractPrior
from ._priors import Dense as Dense
from ._priors import Diagonal as Diagonal
from ._priors import Isotropic as Isotropic
