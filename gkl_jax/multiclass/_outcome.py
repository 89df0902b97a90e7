"""The result protocol of the multiclass fits, as `gkl_jax.Result`'s: `log_z`, `status` (a `gkl_jax.RESULTS` code),
`converged` derived from it, `message`, `num_steps`, `history`, and a repr that prints values."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp

from .._repr import format_value
from .._status import RESULTS, HasStatus, status


def set_fields(obj, status_code, converged, values) -> None:
    """Set the dataclass fields of a multiclass result in its `__init__`: `values` by name, the others to their
    defaults, and `status` from `status_code`, or (where that is None) from `converged` by the rule of the loop
    (`gkl_jax._status.status`: successful where converged, else nonfinite, max_steps_reached or stalled).

    Args:
        obj: the result being initialised.
        status_code: a `RESULTS` code (int scalar), or None.
        converged: bool scalar, used where `status_code` is None.
        values: dict of the other fields.

    Raises:
        ValueError: neither `status_code` nor `converged` given.
        TypeError: an unknown field, or a field without a default missing.
    """
    names = {f.name: f for f in dataclasses.fields(obj)}
    unknown = set(values) - set(names)
    if unknown:
        raise TypeError(f"{type(obj).__name__} got unexpected fields {sorted(unknown)}")
    for name, field in names.items():
        if name == "status":
            continue
        if name in values:
            value = values[name]
        elif field.default is not dataclasses.MISSING:
            value = field.default
        else:
            raise TypeError(f"{type(obj).__name__} needs the field {name!r}")
        setattr(obj, name, value)
    if status_code is None:
        if converged is None:
            raise ValueError(f"{type(obj).__name__} needs status (a gkl_jax.RESULTS code) or converged")
        history = values.get("history")
        max_steps = jnp.shape(history)[0] - 1 if history is not None and jnp.ndim(history) == 1 else jnp.inf
        status_code = status(converged, values["log_z"], values["num_steps"], max_steps)
    obj.status = jnp.asarray(status_code, jnp.int32)


class FitOutcome(HasStatus):
    """The status protocol shared by `Posterior` and `SparsePosterior` (their fields below)."""

    Y: eqx.AbstractVar[jax.Array]
    log_z: eqx.AbstractVar[jax.Array]
    status: eqx.AbstractVar[jax.Array]
    num_steps: eqx.AbstractVar[jax.Array]
    history: eqx.AbstractVar[jax.Array]
    stationarity: eqx.AbstractVar[jax.Array]


    def _repr_items(self):
        n, C = self.Y.shape
        return [("n", n), ("C", C)]

    def __repr__(self):
        head = (f"log_z={format_value(self.log_z)}, status={RESULTS.name(self.status)}, "
                f"num_steps={format_value(self.num_steps)}, stationarity={format_value(self.stationarity)}")
        rest = ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={format_value(v)}"
                         for k, v in self._repr_items())
        return f"{type(self).__name__}({head}, {rest})"
