"""Executable documentation: every notebooks/*.ipynb (small setting, GKL_SMALL=1) and the README quickstart."""

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


def _readme_quickstart():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "README.md has no ```python block under ## Quickstart"
    return "\n".join(blocks)


def test_readme_quickstart_runs(capsys):
    exec(compile(_readme_quickstart(), "README.md:quickstart", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "log Z >=" in out and "converged: True" in out


def test_readme_commands_match_ci():
    text = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(python3 -m venv[^\n]*)\n```", text)
    assert len(commands) == 2 and all("&&" in c for c in commands)
    test_command = commands[1].rsplit("&& ", 1)[1]
    assert test_command == "python -m pytest tests"
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^python -m pytest tests\b", ci, flags=re.M)
