"""``python -m eplb.cli``: the ``eplb`` command."""

import sys

from eplb.cli.main import main

if __name__ == "__main__":  # spawned workers import this module again: never re-run the verb
    sys.exit(main())
