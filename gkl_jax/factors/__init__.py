"""Structured Cholesky factors C of the G-KL covariance S = C^T C (Challis & Barber 2013, Section 4.1).

| factor | S | cost of s_n^2 (dense H) | concave |
|---|---|---|---|
| `Full()` | C^T C, C upper triangular | O(N D^2) | yes |
| `Diagonal()` | diag(d^2) | O(N D) | yes |
| `Banded(bandwidth=B)` | C_ij = 0 for j > i + B (B = 0: diagonal) | O(N D B) | yes |
| `Chevron(rows=K)` | first K rows of C dense, a diagonal below | O(N D K) | yes |
| `Sparse(mask)` | C on a fixed upper-triangular pattern | O(N nnz(C)) | yes |
| `Subspace(rank=K)` | E C_1^T C_1 E^T + c^2 (I - E E^T) | O(N K^2) per basis | yes (for fixed E) |
| `FactorAnalysis(rank=K)` | Theta Theta^T + diag(d^2 + 1e-6 ||theta_i||^2) | O(N D K) | no (L-BFGS) |
"""

from ._banded import Banded as Banded
from ._base import AbstractFactor as AbstractFactor
from ._base import AbstractFixedPointFactor as AbstractFixedPointFactor
from ._chevron import Chevron as Chevron
from ._factor_analysis import FactorAnalysis as FactorAnalysis
from ._full import Diagonal as Diagonal
from ._full import Full as Full
from ._refinable import AbstractRefinableFactor as AbstractRefinableFactor
from ._sparse import Sparse as Sparse
from ._subspace import Subspace as Subspace
