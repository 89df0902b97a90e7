"""The numerical building blocks every solver shares, one implementation each: conjugate gradients
(`conjugate_gradient`), the backtracking line search (`backtrack`, its host form `backtrack_host`, its tests
`sufficient_increase` and `no_decrease`), the L-BFGS two-loop recursion (`lbfgs_direction` on the host,
`LBFGSMemory` compiled, `scale_by_lbfgs` as an optax transformation), the
tolerance and round-off rules of a dtype (`default_tol`, `roundoff`) and the scale-aware stopping test
(`stationary`)."""

from ._cg import conjugate_gradient as conjugate_gradient
from ._lbfgs import LBFGSMemory as LBFGSMemory
from ._lbfgs import lbfgs_direction as lbfgs_direction
from ._lbfgs import scale_by_lbfgs as scale_by_lbfgs
from ._linesearch import ARMIJO_C as ARMIJO_C
from ._linesearch import backtrack as backtrack
from ._linesearch import backtrack_host as backtrack_host
from ._linesearch import no_decrease as no_decrease
from ._linesearch import sufficient_increase as sufficient_increase
from ._tolerance import MAX_HALVINGS as MAX_HALVINGS
from ._tolerance import MAX_STALLS as MAX_STALLS
from ._tolerance import default_tol as default_tol
from ._tolerance import max_abs as max_abs
from ._tolerance import roundoff as roundoff
from ._tolerance import scaled_gradient as scaled_gradient
from ._tolerance import stationary as stationary
from ._tolerance import stop_level as stop_level
