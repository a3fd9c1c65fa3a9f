"""``python -m mindpipe.cli``: the ``mindpipe`` command (how the library runs it in a subprocess)."""

import sys

from mindpipe.cli import main

sys.exit(main())
