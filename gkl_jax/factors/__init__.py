"""Structured Cholesky factors C of the G-KL covariance S = C^T C."""

from ._base import AbstractFactor as AbstractFactor
from ._base import AbstractFixedPointFactor as AbstractFixedPointFactor
from ._full import Diagonal as Diagonal
from ._full import Full as Full
