"""MindPipe: plan, simulate and run 4D-parallel training. The CLI lives in :mod:`mindpipe.cli` (a module per subcommand)."""

__version__ = "0.1.0"
