"""``python -m dpopt.cli``: the ``dpopt`` command."""

import sys

from . import main

sys.exit(main())
