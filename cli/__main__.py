"""``python -m eplb.cli``: the ``eplb`` command."""

import sys

from eplb.cli.main import main

sys.exit(main())
