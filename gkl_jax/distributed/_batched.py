"""Many independent models of the same shape (one Bayesian logistic regression per user, per task, per
bootstrap replicate) fitted as one vectorised program.

`jax.vmap` over `gkl_jax.fit` already works (the constructors skip value checks on tracers and every solver
runs in `lax` control flow, so a batch of while-loops becomes one while-loop that stops when the last member
converges and freezes the members that already have). `stack_models` and `fit_batched` are the convenience
around it: stack a list of models into one model whose array leaves carry a leading batch axis, compile the
vmapped fit once, optionally split the batch over devices, and report non-converged members by index.
"""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._fit import fit
from .._gaussian import Gaussian
from .._model import Model
from .._program import program
from .._result import Result
from .._validate import as_list, is_concrete
from ..operators import Dense

TRACE_COUNT = {"fit_batched": 0}


def stack_models(models) -> Model:
    """One `Model` whose array leaves have a leading axis of length len(models) (every model must have the
    same structure, shapes and dtypes). The result is meant for `fit_batched` or `jax.vmap`, not for `fit`.

    Args:
        models: a non-empty sequence of `gkl_jax.Model`s of one structure, shapes and dtypes.

    Returns:
        `gkl_jax.Model` whose array leaves have shape (len(models), ...).

    Raises:
        ValueError: a single Model, an empty sequence, a member that is not a Model, or members that differ.
    """
    if isinstance(models, Model):
        raise ValueError("models must be a sequence of gkl_jax.Model, got a single Model (pass [model] for a "
                         "batch of one)")
    models = as_list(models, "models", "gkl_jax.Model")
    if not models:
        raise ValueError("models must be a non-empty sequence of gkl_jax.Model")
    first_def = None
    for i, m in enumerate(models):
        if not isinstance(m, Model):
            raise ValueError(f"models[{i}] must be a gkl_jax.Model, got {type(m).__name__}")
        leaves, treedef = jax.tree.flatten(m)
        signature = (treedef, [(jnp.shape(x), jnp.result_type(x)) for x in leaves])
        if first_def is None:
            first_def = signature
        elif signature != first_def:
            raise ValueError(f"models[{i}] differs from models[0] in structure, shapes or dtypes; "
                             "fit_batched needs models of one shape")
    return jax.tree.map(lambda *xs: jnp.stack(xs), *models)


def check_stacked(model: Model) -> Model:
    """`model` if it carries a batch axis as `stack_models` makes it, else ValueError naming `models`.

    Model has no batch marker, so the test is structural: stacking adds a leading axis to every array leaf, so
    a stacked model has no 0-d leaf (a single model's scalars: offsets, prior variances, kernel parameters) and
    every dense H is 3-D (a single model's H is (N, D)). Shapes alone cannot tell the two apart, since a single
    model whose array leaves share one leading length (N = D) looks like a batch by lengths."""
    hint = "pass a list of Models, or stack_models([...]), for a batch; gkl_jax.fit fits one model"
    dense = [op for op in jax.tree.leaves(model, is_leaf=lambda x: isinstance(x, Dense)) if isinstance(op, Dense)]
    for op in dense:
        if op.matrix.ndim == 2:
            raise ValueError(f"models is a single gkl_jax.Model, not one stacked by stack_models: its H has shape "
                             f"{tuple(op.matrix.shape)}, not (batch, N, D); {hint}")
        if op.matrix.ndim != 3:
            raise ValueError(f"models must have one batch axis: its H has shape {tuple(op.matrix.shape)}, not "
                             f"(batch, N, D)")
    for leaf in jax.tree.leaves(model):
        if eqx.is_array(leaf) and leaf.ndim == 0:
            raise ValueError(f"models is a single gkl_jax.Model, not one stacked by stack_models: it has a scalar "
                             f"array leaf with no batch axis; {hint}")
    return model


def batch_size_of(tree) -> int:
    """The common leading-axis length of the array leaves of a stacked tree."""
    sizes = {int(x.shape[0]) for x in jax.tree.leaves(tree) if eqx.is_array(x) and x.ndim >= 1}
    if len(sizes) != 1:
        raise ValueError(f"a stacked model needs one leading batch axis on every array leaf, got sizes {sorted(sizes)}")
    return sizes.pop()


def fit_batched(models, factor=None, *, q0: Gaussian | None = None, mesh: Mesh | None = None,
                axis: str | None = None, **fit_kwargs) -> Result:
    """`gkl_jax.fit` on every model of a batch, as one compiled, vectorised program.

    Compiles once per (batch shape, factor, options): `gkl_jax.distributed.TRACE_COUNT`. Warns with the
    indices of members that did not converge.

    Args:
        models: a sequence of `Model`s of one shape, or a model already stacked by `stack_models` (a single,
            unstacked Model is refused, see `check_stacked`).
        factor: the covariance factor shared by all members, as in `gkl_jax.fit`.
        q0: optional warm starts, a `gkl_jax.Gaussian` whose leaves carry the same leading batch axis.
        mesh: optionally split the batch over the devices of this `jax.sharding.Mesh`; the members are
            independent, so no data moves between devices except the while-loop's "any member still running"
            flag.
        axis: the mesh axis to split along (default: the mesh's first axis).
        **fit_kwargs: solver, tol, max_steps, whiten, max_cg: as in `gkl_jax.fit`, shared by all.

    Returns:
        `gkl_jax.Result` whose leaves have a leading batch axis (result.q.mean[i], result.log_z[i], ...).

    Raises:
        ValueError: models not a batch of one shape, q0 without the same batch axis, or a bad mesh/axis.
    """
    stacked = check_stacked(models) if isinstance(models, Model) else stack_models(models)
    size = batch_size_of(stacked)
    if q0 is not None:
        if not isinstance(q0, Gaussian):
            raise ValueError(f"q0 must be a gkl_jax.Gaussian with a leading batch axis, got {type(q0).__name__}")
        if jnp.ndim(q0.mean) != 2:
            raise ValueError(f"q0 must be a gkl_jax.Gaussian with a leading batch axis: q0.mean has shape "
                             f"{jnp.shape(q0.mean)}, not (batch, dim) (stack single Gaussians with "
                             "jax.tree.map(lambda *x: jnp.stack(x), *qs))")
        if batch_size_of(q0) != size:
            raise ValueError(f"q0 has batch size {batch_size_of(q0)} but models has {size}")
    if mesh is not None:
        if not isinstance(mesh, Mesh):
            raise ValueError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
        axis = mesh.axis_names[0] if axis is None else axis
        if axis not in mesh.axis_names:
            raise ValueError(f"mesh has axes {tuple(mesh.axis_names)} but no axis {axis!r}")
        if size % mesh.shape[axis]:
            raise ValueError(f"the batch of {size} models must be a multiple of the {mesh.shape[axis]} devices on "
                             f"mesh axis {axis!r}")
        split = NamedSharding(mesh, PartitionSpec(axis))
        place = lambda t: jax.tree.map(lambda x: jax.device_put(x, split) if eqx.is_array(x) else x, t)
        stacked = place(stacked)
        q0 = None if q0 is None else place(q0)
    options = tuple(sorted(fit_kwargs.items()))
    result = _fit_batched_jit(stacked, q0, factor, options)
    if is_concrete(result.converged):
        failed = np.flatnonzero(~np.asarray(result.converged))
        if failed.size:
            warnings.warn(f"gkl_jax.fit_batched: {failed.size} of {size} fits did not converge (indices "
                          f"{failed[:10].tolist()}{' ...' if failed.size > 10 else ''}); their results are valid "
                          "bounds but not optima", stacklevel=2)
    return result


@program
def _fit_batched_jit(stacked, q0, factor, options):
    TRACE_COUNT["fit_batched"] += 1
    kwargs = dict(options)
    if q0 is None:
        return jax.vmap(lambda m: fit(m, factor, **kwargs))(stacked)
    return jax.vmap(lambda m, q: fit(m, factor, q0=q, **kwargs))(stacked, q0)
