"""gkl-jax: Gaussian Kullback-Leibler approximate inference in JAX.

    import gkl_jax as gk
    model = gk.Model(gk.priors.Isotropic(dim=D, variance=1.0), gk.Sites(H, gk.potentials.Logistic(y)))
    res = gk.fit(model, factor=gk.factors.Full())
    res.log_z, res.q.mean, res.q.covariance()
"""

from . import baselines as baselines
from . import datasets as datasets
from . import design as design
from . import factors as factors
from . import gp as gp
from . import kernels as kernels
from . import multiclass as multiclass
from . import operators as operators
from . import potentials as potentials
from . import priors as priors
from .baselines import ais as ais, double_loop as double_loop, ep as ep, laplace as laplace, local as local
from ._bound import bound as bound
from ._fit import fit as fit
from . import solvers as solvers
from ._gaussian import Gaussian as Gaussian
from ._model import Model as Model
from ._model import Sites as Sites
from ._result import Result as Result
from . import distributed as distributed, stochastic as stochastic  # after the core: they import it

__version__ = "0.1.0"
