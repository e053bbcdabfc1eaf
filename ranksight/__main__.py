"""``python -m ranksight`` is the ``ranksight`` command."""

import sys

from ranksight.cli import main

sys.exit(main())
