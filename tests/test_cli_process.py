"""The `gkl-jax` command line as a process: quiet exit on a broken pipe, the installed entry point, and the
persistent compilation cache between runs."""

import importlib.metadata
import os
import shutil
import subprocess
import sys

import _helpers_cli
import pytest
from _helpers_cli import run

from gkl_jax import cli

# fixtures shared with the other test_cli_* files (defined in _helpers_cli.py)
files = _helpers_cli.files


def test_broken_pipe_exits_quietly_in_process(capsys, monkeypatch):
    def closed_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "_run_fit", closed_pipe)
    code, out, err = run(capsys, "--no-cache", "fit", "unused.csv", "--quiet")
    assert code == 141 and out == "" and err == ""


_FLOOD = """
import sys
from gkl_jax import cli

def flood(args):
    for i in range(200000):
        print("row", i)
    return 0

cli._run_fit = flood
sys.exit(cli.main(["--no-cache", "fit", "unused.csv", "--quiet"]))
"""


def test_broken_pipe_exits_quietly_in_a_subprocess():
    """`gkl-jax fit ... | head -1`: the reader closes the pipe; no traceback, status 141 (128 + SIGPIPE), and no
    'Exception ignored' from the interpreter's last flush. `_run_fit` is replaced by a printer of 2 MB."""
    proc = subprocess.Popen([sys.executable, "-c", _FLOOD], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    assert proc.stdout.readline() == b"row 0\n"
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == ""


# ------------------------------------------------------------------------------------------------ entry point


def _entry_point():
    try:
        importlib.metadata.distribution("gkl-jax")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("gkl-jax is not installed (pip install -e .), so there is no gkl-jax script")
    script = os.path.join(os.path.dirname(sys.executable), "gkl-jax")
    return script if os.path.exists(script) else shutil.which("gkl-jax")


def test_installed_entry_point_runs_as_a_subprocess(files):
    script = _entry_point()
    assert script, "the gkl-jax console script is not on PATH"
    done = subprocess.run([script, "fit", files["three_labels"]], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "gkl-jax: error: bad labels in target column 'label': a binary likelihood needs two classes (0/1, -1/+1 "
        "or two distinct strings), found 3: 'maybe', 'no', 'yes'"]


def test_compiled_programs_are_cached_between_runs_unless_turned_off(files, tmp_path):
    """Each CLI run is a new process: the compiled programs go to the persistent cache in GKL_JAX_CACHE_DIR, and
    nowhere with --no-cache."""
    script = _entry_point()
    assert script, "the gkl-jax console script is not on PATH"
    for flags, cache in (([], tmp_path / "on"), (["--no-cache"], tmp_path / "off")):
        env = dict(os.environ, GKL_JAX_CACHE_DIR=str(cache))
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
        done = subprocess.run([script, *flags, "fit", files["strings"], "--quiet"], capture_output=True, text=True,
                              timeout=300, stdin=subprocess.DEVNULL, env=env)
        assert done.returncode == 0, done.stderr
        entries = list(cache.iterdir()) if cache.exists() else []
        assert (len(entries) > 0) == (not flags)


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GKL_JAX_CACHE_DIR", str(tmp_path / "x"))
    assert cli.cache_dir() == str(tmp_path / "x")
    monkeypatch.setenv("GKL_JAX_CACHE_DIR", "")
    assert cli.cache_dir() is None
    monkeypatch.delenv("GKL_JAX_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cli.cache_dir() == os.path.join(str(tmp_path / "xdg"), "gkl-jax", "xla")
