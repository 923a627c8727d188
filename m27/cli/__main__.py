"""``python -m m27.cli``: the `m27` command without its console script."""

import sys

from m27.cli.main import main

sys.exit(main())
