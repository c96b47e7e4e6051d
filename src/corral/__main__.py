"""`python -m corral` is the `corral` command."""

from corral.cli import entrypoint

entrypoint()
