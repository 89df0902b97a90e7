"""Covariance functions for Gaussian-process priors: `SquaredExponential`, `Matern12/32/52`,
`RationalQuadratic`, `Linear`, `White`, `Constant`, combined with `+` and `*`."""

from ._kernels import AbstractKernel as AbstractKernel
from ._kernels import AbstractStationary as AbstractStationary
from ._kernels import Constant as Constant
from ._kernels import Linear as Linear
from ._kernels import Matern12 as Matern12
from ._kernels import Matern32 as Matern32
from ._kernels import Matern52 as Matern52
from ._kernels import Product as Product
from ._kernels import RationalQuadratic as RationalQuadratic
from ._kernels import SquaredExponential as SquaredExponential
from ._kernels import Sum as Sum
from ._kernels import White as White
