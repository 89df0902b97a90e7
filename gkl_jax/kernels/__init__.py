"""Covariance functions for Gaussian-process priors: `SquaredExponential`, `Matern12/32/52`,
`RationalQuadratic`, `Linear`, `White`, `Constant`, combined with `+` and `*`; `median_distance`, a data-scaled
starting lengthscale."""

from ._kernels import AbstractKernel as AbstractKernel
from ._kernels import AbstractStationary as AbstractStationary
from ._kernels import Constant as Constant
from ._kernels import Linear as Linear
from ._kernels import Product as Product
from ._kernels import Sum as Sum
from ._kernels import White as White
from ._stationary import Matern12 as Matern12
from ._stationary import Matern32 as Matern32
from ._stationary import Matern52 as Matern52
from ._stationary import RationalQuadratic as RationalQuadratic
from ._stationary import SquaredExponential as SquaredExponential
from ._stationary import median_distance as median_distance
