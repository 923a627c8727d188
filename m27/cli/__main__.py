"""``python -m m27.cli``: the `m27` command without its console script.

``python -m m27.cli --warm-runner HOME`` is the node service's warm runner
(:mod:`m27.cli.warm`), not a command users type.
"""

import sys

from m27.cli.main import main

if sys.argv[1:2] == ["--warm-runner"]:
    from m27.cli.warm import serve_runner

    sys.exit(serve_runner(sys.argv[2:], main))
sys.exit(main())
