"""Executable documentation: the README's commands are CI's; every notebooks/*.ipynb is its build script's cells
with the outputs of a full-setting run (default run), and executes in the small setting, GKL_SMALL=1 (extended
tier: `pytest --extended`, 15-40 s of compilation each). The README's Python blocks run in tests/test_docs.py."""

import json
import os
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT = 300


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """Environment for the notebook kernels: GKL_SMALL=1, and a `python3` kernelspec that runs this very
    interpreter (put first on JUPYTER_PATH, so a user-level `python3` kernelspec cannot shadow it)."""
    spec_dir = tmp_path_factory.mktemp("jupyter") / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (gkl-jax tests)", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GKL_SMALL", "1")
        extra = [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
        mp.setenv("JUPYTER_PATH", os.pathsep.join([str(spec_dir.parents[1])] + extra))
        mp.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        yield


def test_notebooks_exist():
    assert ROOT.joinpath("notebooks", "01_quickstart.ipynb") in NOTEBOOKS


@pytest.mark.extended
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, kernel_env):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors


def test_readme_commands_match_ci():
    text = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(python3 -m venv[^\n]*)\n```", text)
    assert len(commands) == 2 and all("&&" in c for c in commands)
    test_command = commands[1].rsplit("&& ", 1)[1]
    assert test_command == "python -m pytest tests"
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^python -m pytest tests\b", ci, flags=re.M)


def _build_script(path):
    import importlib.util

    number = path.name.split("_", 1)[0]
    script = ROOT / "notebooks" / f"_build_{number}.py"
    assert script.exists(), f"{path.name} has no build script {script.name}"
    sys.path.insert(0, str(script.parent))
    try:
        spec = importlib.util.spec_from_file_location(f"_build_{number}", script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(script.parent))
    return module


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_stored_notebook_is_its_build_script_run_in_the_full_setting(path):
    """The committed .ipynb has its build script's cells, every code cell executed in order without an error,
    in the full setting (`python notebooks/_build_NN.py --execute` records it in the notebook's metadata)."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    cells = _build_script(path).CELLS
    assert [(c.cell_type, c.source) for c in nb.cells] == [
        ("markdown" if kind == "md" else "code", source) for kind, source in cells], (
        f"{path.name} differs from its build script: run python notebooks/_build_{path.name[:2]}.py --execute")
    assert nb.metadata.get("gkl_jax", {}).get("setting") == "full", f"{path.name}: outputs not from the full setting"
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1)), f"{path.name}: cells not executed once, in order"
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]


def test_every_notebook_is_a_page_of_the_docs_site():
    """Each notebooks/*.ipynb is linked under docs/notebooks/, listed in its index and in mkdocs.yml's nav."""
    index = (ROOT / "docs" / "notebooks" / "index.md").read_text()
    nav = (ROOT / "mkdocs.yml").read_text()
    for path in NOTEBOOKS:
        page = ROOT / "docs" / "notebooks" / path.name
        assert page.exists() and page.resolve() == path.resolve(), f"docs/notebooks/{path.name} missing"
        assert f"]({path.name})" in index and f"notebooks/{path.name}" in nav, path.name
