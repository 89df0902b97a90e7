"""gkl-jax: Gaussian Kullback-Leibler approximate inference in JAX.

    import gkl_jax as gk
    model = gk.Model(gk.priors.Isotropic(dim=D, variance=1.0), gk.Sites(H, gk.potentials.Logistic(y)))
    res = gk.fit(model, factor=gk.factors.Full())
    res.log_z, res.q.mean, res.q.covariance()

The subpackages and names below load on first use (PEP 562), so `import gkl_jax` (and `gkl-jax --version`)
does not import JAX.
"""

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_SUBPACKAGES = ("baselines", "datasets", "design", "distributed", "factors", "gp", "kernels", "multiclass",
                "operators", "potentials", "priors", "solvers", "stochastic")
_NAMES = {"ais": ".baselines", "double_loop": ".baselines", "ep": ".baselines", "laplace": ".baselines",
          "local": ".baselines", "bound": "._bound", "fit": "._fit", "Gaussian": "._gaussian", "Model": "._model",
          "Sites": "._model", "Result": "._result", "predict": "._predict", "Float32Warning": "._traps",
          "RecompilationWarning": "._traps", "save": "._io", "load": "._io", "to_inference_data": "._arviz",
          "RESULTS": "._status", "set_memory_release": "._memory", "MemoryReleaseWarning": "._memory"}


def __getattr__(name):
    if name in _SUBPACKAGES:
        value = importlib.import_module(f".{name}", __name__)
    elif name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_SUBPACKAGES) | set(_NAMES))


if TYPE_CHECKING:  # what the names are, for type checkers and IDEs
    from . import baselines, datasets, design, distributed, factors, gp, kernels, multiclass, operators  # noqa: F401
    from . import potentials, priors, solvers, stochastic  # noqa: F401
    from ._bound import bound  # noqa: F401
    from ._fit import fit  # noqa: F401
    from ._gaussian import Gaussian  # noqa: F401
    from ._model import Model, Sites  # noqa: F401
    from ._predict import predict  # noqa: F401
    from ._result import Result  # noqa: F401
    from ._traps import Float32Warning, RecompilationWarning  # noqa: F401
    from ._io import load, save  # noqa: F401
    from ._arviz import to_inference_data  # noqa: F401
    from ._status import RESULTS  # noqa: F401
    from ._memory import MemoryReleaseWarning, set_memory_release  # noqa: F401
    from .baselines import ais, double_loop, ep, laplace, local  # noqa: F401
