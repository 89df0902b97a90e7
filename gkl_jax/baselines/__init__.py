"""Classic deterministic Gaussian approximations on the same Model: Laplace, EP, local bounds, the double loop, AIS.

Every method takes a `gkl_jax.Model` and returns a `gkl_jax.Result` (AIS: an `AISResult` with a standard error):

- `laplace(model)`        the mode and the inverse Hessian there; log Z_LA (not a bound)
- `ep(model, power, damping)`  Gaussian (power) EP with damped parallel updates; log Z_EP (not a bound)
- `local(model)`          the local variational lower bound, optimised exactly (a bound)
- `double_loop(model, rank)`  the scalable glm-ie algorithm with Lanczos variances (an estimate, not a bound)
- `ais(model, key)`       annealed importance sampling from a Gaussian start: ground truth log Z +- stderr
"""

from ._ais import AISResult as AISResult
from ._ais import ais as ais
from ._double_loop import double_loop as double_loop
from ._ep import ep as ep
from ._laplace import laplace as laplace
from ._local import local as local
from ._site_bounds import height as height
