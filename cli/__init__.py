"""The ``eplb`` command (installed as `eplb.cli`): one module per verb over the library."""

from eplb.cli.main import main

__all__ = ["main"]
