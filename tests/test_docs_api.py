"""The package's docstrings as a contract: every public function and class states its Args and Returns,
package code cites papers by author and year, and docstrings carry no timings. The public API is read from the
source (ast), not imported."""

import ast
import os
import pathlib
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- docstrings as a contract -----------------------------------------------------------------------------------
# The public API is read from the source (ast), not imported: importing every sub-package (JAX, equinox,
# scikit-learn) takes longer than this test may.
API_SUBPACKAGES = ("baselines", "datasets", "design", "distributed", "factors", "gp", "kernels", "multiclass",
                   "operators", "potentials", "priors", "solvers", "stochastic", "sklearn")
ARGS = re.compile(r"^\s*Args:\s*$", re.M)
RETURNS = re.compile(r"^\s*(Returns|Yields):\s*$", re.M)
FIELDS = re.compile(r"^\s*(Args|Attributes):\s*$", re.M)
PACKAGE = os.path.join(ROOT, "gkl_jax")


class _Source:
    """The parsed modules of gkl_jax, by dotted name, and the resolution of a name in a module to its definition."""

    def __init__(self):
        self.trees, self.found = {}, {}

    def path(self, module):
        base = os.path.join(ROOT, *module.split("."))
        return os.path.join(base, "__init__.py") if os.path.isdir(base) else base + ".py"

    def tree(self, module):
        if module not in self.trees:
            import ast

            with open(self.path(module), encoding="utf-8") as fh:
                self.trees[module] = ast.parse(fh.read())
        return self.trees[module]

    @staticmethod
    def absolute(module, node):
        """The dotted module that a relative `from ... import` in `module` names."""
        is_package = os.path.isdir(os.path.join(ROOT, *module.split(".")))
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[:len(parts) - (node.level - 1)]
        return ".".join(parts + ([node.module] if node.module else []))

    def resolve(self, module, name, depth=0):
        """(module, ast node) of the def/class that `name` is in `module`, following imports; None outside."""
        if (module, name) not in self.found:
            self.found[module, name] = self._resolve(module, name, depth)
        return self.found[module, name]

    def _resolve(self, module, name, depth):
        import ast

        assert depth < 20, (module, name)
        for node in self.tree(module).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                return module, node
        for node in self.tree(module).body:
            if isinstance(node, ast.ImportFrom) and node.level:
                for alias in node.names:
                    source = self.absolute(module, node)
                    if (alias.asname or alias.name) == name and os.path.exists(self.path(source)):
                        return self.resolve(source, alias.name, depth + 1)
        return None


def _literal(tree, target):
    import ast

    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == target for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def public_api():
    """[(qualified name, module, ast node)] of gkl_jax's lazy top-level names and each sub-package's public
    functions and classes (its `__all__`, else its `from .x import name as name` re-exports)."""
    import ast

    src = _Source()
    out = []
    for name, where in _literal(src.tree("gkl_jax"), "_NAMES").items():
        found = src.resolve("gkl_jax" + where, name)
        out.append((f"gkl_jax.{name}",) + found)
    for sub in API_SUBPACKAGES:
        module = f"gkl_jax.{sub}"
        names = _literal(src.tree(module), "__all__") or [
            alias.asname or alias.name for node in src.tree(module).body if isinstance(node, ast.ImportFrom)
            and node.level for alias in node.names if not (alias.asname or alias.name).startswith("_")]
        for name in names:
            found = src.resolve(module, name)
            if found is not None:       # constants (TRACE_COUNT, SITE_AXIS) are not callables
                out.append((f"{module}.{name}",) + found)
    return src, out


def _decorators(node):
    import ast

    names = []
    for d in node.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        names.append(d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", ""))
    return names


def _takes_arguments(fn):
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return any(n not in ("self", "cls") for n in names)


def _contract_problems(fn):
    import ast

    doc = ast.get_docstring(fn) or ""
    problems = []
    if _takes_arguments(fn) and not ARGS.search(doc):
        problems.append("Args")
    returns_none = isinstance(fn.returns, ast.Constant) and fn.returns.value is None
    if not returns_none and not RETURNS.search(doc):
        problems.append("Returns")
    return problems


def _bases(src, module, cls):
    """(module, ClassDef) of the gkl_jax base classes of `cls`, nearest first (depth-first over the bases)."""
    import ast

    out = []
    for base in cls.bases:
        if isinstance(base, ast.Name):
            found = src.resolve(module, base.id)
            if found is not None and isinstance(found[1], ast.ClassDef):
                out.append(found)
                out += _bases(src, *found)
    return out


def _methods(cls):
    import ast

    return {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _constructor_takes_arguments(src, module, cls):
    """Whether constructing the class takes arguments: its (or a base's) __init__, or annotated dataclass
    fields (equinox modules, NamedTuples) that are not ClassVars."""
    import ast

    for _, c in [(module, cls)] + _bases(src, module, cls):
        init = _methods(c).get("__init__")
        if init is not None:
            return _takes_arguments(init)
        for node in c.body:
            if isinstance(node, ast.AnnAssign) and "ClassVar" not in ast.unparse(node.annotation):
                return True
    return False


def api_docstring_problems():
    """['name: no Args / Returns'] for every public callable of the walked API.

    Rules: a function states Args (when it takes any) and Returns (unless annotated `-> None`); a class states its
    constructor arguments under Args or Attributes (result containers) in its own or its __init__'s docstring; a
    public method states Args/Returns, or overrides a method of a gkl_jax base class that does (the contract is the
    base's, as `inspect.getdoc` and `help` show it). Abstract classes (named Abstract*, as equinox requires; never
    constructed) need no Args; properties and dunder methods are exempt.
    """
    import ast

    src, api = public_api()
    problems, seen = [], set()
    for qualname, module, node in api:
        if (module, node.name) in seen:
            continue
        seen.add((module, node.name))
        if isinstance(node, ast.FunctionDef):
            missing = _contract_problems(node)
            problems += [f"{qualname}: no {' / '.join(missing)}"] if missing else []
            continue
        init = _methods(node).get("__init__")
        docs = (ast.get_docstring(node) or "") + ("" if init is None else ast.get_docstring(init) or "")
        if (not node.name.startswith("Abstract") and _constructor_takes_arguments(src, module, node)
                and not FIELDS.search(docs)):
            problems.append(f"{qualname}: no Args (class or __init__ docstring)")
        bases = _bases(src, module, node)
        for name, fn in _methods(node).items():
            decorators = _decorators(fn)
            if name.startswith("_") or "property" in decorators or "setter" in decorators:
                continue
            missing = _contract_problems(fn)
            inherited = any(name in _methods(base) and not _contract_problems(_methods(base)[name])
                            for _, base in bases)
            if missing and not inherited:
                problems.append(f"{qualname}.{name}: no {' / '.join(missing)}")
    return problems


def test_public_api_docstrings_state_args_and_returns():
    """Every public function, class and method of the walked API has Google-style Args/Returns sections."""
    assert len(public_api()[1]) > 100
    problems = api_docstring_problems()
    assert not problems, f"{len(problems)} public callables without Args/Returns:\n" + "\n".join(problems)


PRIVATE_CITATION = re.compile(r"papers/00|shared/notes|the notes|notes'|\(notes\b|; notes\b", re.IGNORECASE)


def test_package_code_cites_papers_by_author_and_year():
    """No `papers/00N` paths or "the notes" in package code: those files do not ship with the package (cite
    Challis & Barber 2013 etc., resolved on docs/references.md)."""
    hits = []
    for folder, _, files in os.walk(os.path.join(ROOT, "gkl_jax")):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as fh:
                    hits += [f"{os.path.relpath(path, ROOT)}:{i}: {line.strip()}" for i, line in enumerate(fh, 1)
                             if PRIVATE_CITATION.search(line)]
    assert not hits, "\n".join(hits)


TIMING = re.compile(r"\b\d+(\.\d+)? ?ms\b|\b\d+(\.\d+)?(-\d+(\.\d+)?)? s (instead|against|per|on|where|to|\()"
                    r"|\b\d+(\.\d+)? seconds\b")


def test_package_docstrings_carry_no_timings():
    """Timings live on the results and design-decisions pages, not in docstrings (they go stale)."""
    found = []
    for path in sorted(pathlib.Path(PACKAGE).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node, clean=False) or ""
                name = getattr(node, "name", "<module>")
                found += [f"{path.name}:{name}: {m.group(0)}" for m in TIMING.finditer(doc)]
    assert not found, found
    assert TIMING.search("0.83 s per value") and TIMING.search("took 1.4 ms") and TIMING.search("5-30 s on a")
