"""The public signatures are typed (issue 60, part 5): every public function of `gkl_jax`, `gkl_jax.gp` and
`gkl_jax.baselines`, and the constructor of every public class defined there, annotates every parameter (and a
function its return), with annotations that resolve at run time (`typing.get_type_hints`: no name that only a
type checker sees). Arrays carry jaxtyping dtypes and shapes where the shape says something."""

import importlib
import inspect
import typing

import jaxtyping
import pytest

import gkl_jax as gk

# Public callables in modules that other branches are rewriting: annotated there, then deleted from this list.
NOT_YET: set[str] = set()


def public_callables():
    """[(qualified name, object)]: gkl_jax's lazily loaded names and the public names of gkl_jax.gp and
    gkl_jax.baselines (their `__all__`, else every name without a leading underscore)."""
    out = [(f"gkl_jax.{name}", getattr(gk, name)) for name in sorted(gk._NAMES)]
    for sub in ("gp", "baselines"):
        module = importlib.import_module(f"gkl_jax.{sub}")
        names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
        out += [(f"gkl_jax.{sub}.{name}", getattr(module, name)) for name in names]
    return [(name, obj) for name, obj in out if callable(obj) and not inspect.ismodule(obj)]


def missing_annotations(obj) -> list[str]:
    """The parameters (and "return") of a function, or of a class's own constructor, that have no annotation."""
    if inspect.isclass(obj):
        init = obj.__dict__.get("__init__") or next((c.__dict__["__init__"] for c in obj.__mro__
                                                     if "__init__" in c.__dict__), None)
        if not inspect.isfunction(init):        # a builtin's constructor (warnings, enumerations)
            return []
        fn, needs_return = init, False
    else:
        fn, needs_return = inspect.unwrap(obj), True
    signature = inspect.signature(fn)
    missing = [name for name, p in signature.parameters.items()
               if name not in ("self", "cls") and p.annotation is inspect.Parameter.empty]
    if needs_return and signature.return_annotation is inspect.Signature.empty:
        missing.append("return")
    typing.get_type_hints(fn)                   # raises NameError for an annotation that does not resolve
    return missing


def test_the_check_sees_a_missing_annotation():
    def untyped(x, y: int):
        return x

    def typed(x: jaxtyping.Float[jaxtyping.Array, "n d"], *, y: int = 1) -> None:
        return None

    class Builtin(UserWarning):
        pass

    assert missing_annotations(untyped) == ["x", "return"]
    assert missing_annotations(typed) == [] and missing_annotations(Builtin) == []
    assert len(public_callables()) > 30


@pytest.mark.parametrize("name, obj", public_callables(), ids=[n for n, _ in public_callables()])
def test_public_callable_is_fully_annotated(name, obj):
    missing = missing_annotations(obj)
    if name in NOT_YET:
        assert missing, f"{name} is annotated now: delete it from NOT_YET"
        pytest.xfail(f"{name}: annotated with its module's branch")
    assert not missing, f"{name}: no annotation for {missing}"


def test_arrays_carry_shapes_where_they_say_something():
    """A few spot checks that the annotations are jaxtyping shapes, not bare `Any`."""
    hints = typing.get_type_hints(gk.gp.latent)
    assert "n d" in str(hints["X_new"]) and "n" in str(hints["return"])
    assert "n d" in str(typing.get_type_hints(gk.predict)["H_new"])
    assert "Float" in str(typing.get_type_hints(gk.bound)["return"])
