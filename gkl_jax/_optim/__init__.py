"""The numerical building blocks every solver shares, one implementation each: conjugate gradients
(`conjugate_gradient`), the backtracking line search (`backtrack`), the host L-BFGS two-loop recursion
(`lbfgs_direction`), the tolerance and round-off rules of a dtype (`default_tol`, `roundoff`) and the
scale-aware stopping test (`stationary`)."""

from ._cg import conjugate_gradient as conjugate_gradient
from ._lbfgs import lbfgs_direction as lbfgs_direction
from ._linesearch import backtrack as backtrack
from ._tolerance import MAX_HALVINGS as MAX_HALVINGS
from ._tolerance import MAX_STALLS as MAX_STALLS
from ._tolerance import default_tol as default_tol
from ._tolerance import max_abs as max_abs
from ._tolerance import roundoff as roundoff
from ._tolerance import scaled_gradient as scaled_gradient
from ._tolerance import stationary as stationary
from ._tolerance import stop_level as stop_level
