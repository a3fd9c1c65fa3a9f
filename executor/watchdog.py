"""``python -m mindpipe.executor.watchdog RUN_DIR [LOG]``: clean up after a ``mindpipe run`` launcher that died.

SIGKILL cannot be caught, so the launcher cannot clean up after it; this small process can. The
launcher starts it in a session of its own (a terminal's Ctrl-C or a signal to the launcher's
group does not reach it) with a pipe on its stdin, and writes to the pipe:

* ``torchrun PID START`` once torchrun runs;
* ``done`` when the launcher has stopped everything and removed ``RUN_DIR`` itself.

End of file without ``done`` means the launcher died: the watchdog stops torchrun's process group
and every rank registered in ``RUN_DIR`` (:func:`mindpipe.executor.rundir.stop`) and removes
``RUN_DIR`` and the run's log ``LOG``. It imports neither torch nor anything that does, so it costs a few MB and starts fast.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from mindpipe.executor.rundir import ProcRef, stop


def watch(run_dir: Path, log: Path | None = None, lines: Sequence[str] | None = None) -> bool:
    """Follow the launcher's messages (stdin unless ``lines``); clean up unless it said ``done``.

    Returns:
        Whether the watchdog had to clean up (the launcher died).
    """
    torchrun: ProcRef | None = None
    for line in (lines if lines is not None else sys.stdin):
        words = line.split()
        if words[:1] == ["done"]:
            return False
        if words[:1] == ["torchrun"] and len(words) == 3:
            torchrun = ProcRef(int(words[1]), None if words[2] == "-" else int(words[2]))
    stop(run_dir, torchrun, grace_s=5.0)
    shutil.rmtree(run_dir, ignore_errors=True)
    if log is not None:
        log.unlink(missing_ok=True)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (arguments: the run directory, and the run's log)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (1, 2):
        print("usage: python -m mindpipe.executor.watchdog RUN_DIR [LOG]", file=sys.stderr)
        return 2
    watch(Path(args[0]), Path(args[1]) if len(args) == 2 else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
