"""``python -m danaus``: the same as the ``danaus`` command."""

import sys

from danaus._cli.main import main

sys.exit(main())
