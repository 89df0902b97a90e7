"""Linear operators usable as a `Sites` projection H (rows h_n) and as measurement matrices."""

from ._base import AbstractOperator as AbstractOperator
from ._base import Dense as Dense
from ._base import Identity as Identity
from ._base import Sparse as Sparse
from ._base import as_operator as as_operator
from ._finite_difference import FiniteDifference2D as FiniteDifference2D
from ._stack import Stack as Stack
from ._stack import image_filters as image_filters
from ._wavelets import Wavelet2D as Wavelet2D
