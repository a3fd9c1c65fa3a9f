"""MindPipe: plan, simulate and run 4D-parallel training. The CLI lives in :mod:`mindpipe.cli`."""

__version__ = "0.1.0"
