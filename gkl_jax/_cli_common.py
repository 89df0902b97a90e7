"""What the command line, its input checks (`gkl_jax._cli_input`) and the demo share: the error type, the binary
likelihoods, the demo's output folder and the file checks (standard library only, so nothing here imports JAX)."""

import os

BINARY = ("logistic", "probit")
DEMO_DIR = "gkl-jax-demo"


class CLIError(Exception):
    """A usage or data error; reported as one line on stderr with exit status 2."""


def prepare_output_dir(output_dir):
    """The demo's --output-dir: created if missing; CLIError where it is a file or cannot be written."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise CLIError(f"--output-dir {output_dir} exists and is not a directory")
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as err:
        raise CLIError(f"cannot create --output-dir {output_dir}: {err.strerror}") from None
    if not os.access(output_dir, os.W_OK):
        raise CLIError(f"--output-dir {output_dir} is not writable")


def check_data_path(path):
    """CLIError unless `path` exists and is not a directory (checked before numpy is imported)."""
    if not os.path.exists(path):
        raise CLIError(f"file not found: {path}")
    if os.path.isdir(path):
        raise CLIError(f"{path} is a directory, not a CSV file")


def check_writable(path, flag="--output"):
    """CLIError where `path` (given with `flag`) is a directory or its directory is missing or read-only.

    Args:
        path: the file to write, or None (nothing to check).
        flag: the option that named it, for the message.
    """
    if path is None:
        return
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise CLIError(f"{flag} {path} is a directory")
    if not os.path.isdir(directory):
        raise CLIError(f"cannot write {flag} {path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK):
        raise CLIError(f"cannot write {flag} {path}: directory {directory} is not writable")
