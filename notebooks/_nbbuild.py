"""Shared command line of the notebooks/_build_NN.py scripts: turn a list of (kind, source) cells into a
notebook, optionally execute it, and write it next to the scripts.

    python notebooks/_build_NN.py              # regenerate the notebook without outputs
    python notebooks/_build_NN.py --execute    # run it (full setting) and store the outputs
    python notebooks/_build_NN.py --execute --small   # the GKL_SMALL=1 setting the tests run
"""

import argparse
import os
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = os.path.dirname(os.path.abspath(__file__))


def build(cells) -> nbformat.NotebookNode:
    """The notebook of `cells` ((\"md\" or \"code\", source) pairs), without outputs."""
    nb = new_notebook(cells=[new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def main(cells, name: str, description: str, argv=None, *, timeout: int = 1200) -> int:
    """Write notebooks/`name` from `cells`; with --execute run it first (each cell within `timeout` s)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--execute", action="store_true", help="run it and store the outputs")
    parser.add_argument("--small", action="store_true", help="execute in the GKL_SMALL=1 setting")
    args = parser.parse_args(argv)
    nb = build(cells)
    nb.metadata["gkl_jax"] = {"setting": "not executed"}
    if args.execute:
        from nbclient import NotebookClient

        if args.small:  # the kernel inherits the environment
            os.environ["GKL_SMALL"] = "1"
        else:
            os.environ.pop("GKL_SMALL", None)
        NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": HERE}}).execute()
        import gkl_jax

        nb.metadata["gkl_jax"] = {"setting": "small" if args.small else "full", "version": gkl_jax.__version__}
    nbformat.validate(nb)
    path = os.path.join(HERE, name)
    nbformat.write(nb, path)
    print(f"wrote {path}", file=sys.stderr)
    return 0
