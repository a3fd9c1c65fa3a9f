"""``python -m mindpipe``: the ``mindpipe`` command, for an environment whose scripts are not on PATH."""

import sys

from mindpipe.cli import main

sys.exit(main())
