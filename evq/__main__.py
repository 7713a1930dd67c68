"""``python -m evq``: the ``evq`` command, for an environment whose scripts are not on PATH."""

import sys

from evq.cli import main

sys.exit(main())
