"""Site-projection potentials phi_n(h_n^T w)."""

from ._base import AbstractPotential as AbstractPotential
from ._base import AbstractQuadraturePotential as AbstractQuadraturePotential
from ._potentials import Cauchy as Cauchy
from ._potentials import Custom as Custom
from ._potentials import Gaussian as Gaussian
from ._potentials import Laplace as Laplace
from ._potentials import Logistic as Logistic
from ._potentials import Poisson as Poisson
from ._potentials import Probit as Probit
from ._potentials import StudentT as StudentT
