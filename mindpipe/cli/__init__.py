"""The ``mindpipe`` command line: thin wiring from subcommands to library calls.

One module per subcommand (:mod:`~mindpipe.cli.profile`, :mod:`~mindpipe.cli.import_`,
:mod:`~mindpipe.cli.inspect`, :mod:`~mindpipe.cli.simulate`, :mod:`~mindpipe.cli.tune`,
:mod:`~mindpipe.cli.calibrate`, :mod:`~mindpipe.cli.validate`, :mod:`~mindpipe.cli.run`,
:mod:`~mindpipe.cli.demo`), each with ``add_parser(sub)`` and ``cmd_<name>(args, argv) -> int``,
and one loader per kind of input (:mod:`~mindpipe.cli.loaders`).

Every input problem is reported as one line ``mindpipe: error: <file>: <key>: <rule>`` on stderr
with exit code 2, never a traceback. ``--json`` prints exactly one JSON object on stdout;
progress always goes to stderr. torch is imported only by the subcommands that need it (profile,
run, demo), and only when they run.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence

from mindpipe import __version__
from mindpipe.cli import calibrate, demo, import_, inspect, profile, run, simulate, tune, validate
from mindpipe.cli.args import OneLineParser
from mindpipe.cli.output import stderr
from mindpipe.traces.errors import ContractError, one_line

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141

# In the order ``mindpipe --help`` lists them.
SUBCOMMANDS = (profile, import_, inspect, simulate, tune, validate, calibrate, demo, run)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    p = OneLineParser(prog="mindpipe", description="Plan, simulate and run 4D-parallel training.")
    p.add_argument("--version", action="version", version=f"mindpipe {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mindpipe`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version (0) or a usage error, already printed on one line (2)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_USAGE)
    func: Callable[[argparse.Namespace, Sequence[str]], int] = args.func
    try:
        with _stop_signals_raise():
            return func(args, argv)
    except Stopped as e:  # SIGTERM or SIGHUP: cleanup ran (a sweep's workers stopped, its state saved)
        stderr(f"mindpipe: stopped by {signal.Signals(e.signum).name}")
        return 128 + e.signum
    except ContractError as e:
        stderr(f"mindpipe: error: {e}")
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader of stdout went away (``mindpipe simulate ... | head``): not an input error. Stop
        # quietly, as a shell tool killed by SIGPIPE does (128 + 13), and point stdout at /dev/null
        # so the interpreter's final flush does not raise again.
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as e:
        stderr(one_line(f"mindpipe: error: {getattr(e, 'filename', '') or ''}: {e.strerror or e}"))
        return EXIT_USAGE
    except KeyboardInterrupt:
        stderr("mindpipe: interrupted")
        return 130


class Stopped(BaseException):
    """SIGTERM or SIGHUP arrived: raised in the main thread so that every ``finally`` and context
    manager on the way out runs, as for Ctrl-C (a BaseException, so ``except Exception`` passes it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _stop_signals_raise() -> Iterator[None]:
    """While a command runs, SIGTERM and SIGHUP raise :class:`Stopped` (the default would end the
    process at once, leaving child processes behind). ``mindpipe run`` installs its own handlers
    while it supervises ranks. Only in the main thread; the previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _silence_stdout() -> None:
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout already closed or not a real file (tests capture it)
        pass


__all__ = ["EXIT_BROKEN_PIPE", "EXIT_USAGE", "SUBCOMMANDS", "build_parser", "main"]
