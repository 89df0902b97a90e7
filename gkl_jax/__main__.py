"""`python -m gkl_jax ...` runs the `gkl-jax` command line (see `gkl_jax.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
