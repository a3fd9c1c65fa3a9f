"""MindPipe: plan, simulate and run 4D-parallel training. The CLI lives in :mod:`mindpipe.cli` (a module per subcommand)."""

from pkgutil import extend_path

# In the repository, ``mindpipe/`` holds only the CLI; the sub-packages (traces, simulator, tuner,
# executor) join it at install time. With the checkout on ``sys.path`` ahead of an installed copy
# (as the tests' launched runs put it), the installed copy's ``mindpipe/`` joins the search path so
# ``mindpipe.traces`` and its siblings resolve; an editable install's finder needs none of this.
__path__ = extend_path(__path__, __name__)

__version__ = "0.1.0"
