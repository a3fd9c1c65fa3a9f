"""Run torchrun for ``mindpipe run`` so that no process and no temporary file outlives the launcher.

On one CPU host the command run is the rank spawner (:mod:`mindpipe.executor.spawn`) instead of
torchrun; everything below holds for it the same way ("torchrun" here means whichever of the two).

* torchrun runs in a session of its own (its ranks start their own too) with its output going to a
  log file, not the terminal: the user sees one line per outcome, and the log keeps everything;
* SIGINT (KeyboardInterrupt), SIGTERM and SIGHUP of the launcher, and ``--run-timeout``, stop
  torchrun's group and every rank (:func:`mindpipe.executor.rundir.stop`) before the launcher
  returns; torchrun also gets SIGTERM from the kernel if the launcher dies (``PR_SET_PDEATHSIG``),
  and every rank SIGKILL if torchrun dies (:func:`mindpipe.executor.rundir.register_rank`);
* SIGKILL of the launcher cannot be caught: a watchdog (:mod:`mindpipe.executor.watchdog`), in a
  session of its own, sees the launcher's pipe close, stops everything and removes the run
  directory and the log.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from mindpipe.executor import rundir

TRAPPED = (signal.SIGTERM, signal.SIGHUP)
TICK_S = 1.0  # how often run_torchrun's tick runs while the ranks do
_PR_SET_PDEATHSIG = 1


class Signalled(BaseException):
    """The launcher received a trapped signal (SIGTERM, SIGHUP) while the run was going."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def _pdeathsig(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive ``sig`` when the launcher dies (Linux; None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)

    return arm


def start_watchdog(run_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    """The watchdog for this run (see :mod:`mindpipe.executor.watchdog`), holding our pipe on its stdin."""
    return subprocess.Popen([sys.executable, "-m", "mindpipe.executor.watchdog", str(run_dir), str(log)],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def tell(watchdog: subprocess.Popen[bytes], message: str) -> None:
    """Send one line to the watchdog (ignored if it is gone)."""
    with contextlib.suppress(OSError, ValueError):
        if watchdog.stdin is not None:  # always: it is started with stdin=PIPE
            watchdog.stdin.write(message.encode() + b"\n")
            watchdog.stdin.flush()


def release(watchdog: subprocess.Popen[bytes], done: bool = True) -> None:
    """Tell the watchdog the run is cleaned up (``done``; else it cleans up itself), and let it go."""
    if done:
        tell(watchdog, "done")
    with contextlib.suppress(OSError, ValueError):
        if watchdog.stdin is not None:
            watchdog.stdin.close()
    if not done:
        return  # it stops what is left in its own time
    try:
        watchdog.wait(timeout=10)
    except subprocess.TimeoutExpired:
        watchdog.kill()
        watchdog.wait()


@contextlib.contextmanager
def trapped_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into :class:`Signalled` while the block runs (main thread only)."""

    def raise_signalled(signum: int, frame: Any) -> None:
        raise Signalled(signum)

    old: dict[int, Any] = {}
    for sig in TRAPPED:
        with contextlib.suppress(ValueError, OSError):  # not the main thread: leave the default
            old[sig] = signal.signal(sig, raise_signalled)
    try:
        yield
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)


def _stop(run_dir: Path, torchrun: rundir.ProcRef, proc: subprocess.Popen[str]) -> None:
    """Stop everything; a second Ctrl-C or SIGTERM meanwhile skips the grace period but never the stopping."""
    grace = 10.0
    while True:
        try:
            rundir.stop(run_dir, torchrun, grace_s=grace)
            proc.wait()
            return
        except (KeyboardInterrupt, Signalled):
            grace = 0.0


def _pump(stream: IO[str], log: IO[str], tail: deque[str]) -> None:
    with contextlib.suppress(OSError, ValueError):  # the log closes if the launcher gives up waiting
        for line in stream:
            tail.append(line.rstrip("\n"))
            log.write(line)
            log.flush()


def _wait(proc: subprocess.Popen[str], timeout: float | None, tick: Callable[[], None] | None) -> int:
    """``proc.wait(timeout)``, calling ``tick`` about every :data:`TICK_S` seconds while it runs."""
    if tick is None:
        return proc.wait(timeout=timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout or 0.0)
        try:
            return proc.wait(timeout=TICK_S if left is None else min(TICK_S, left))
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() >= deadline:
                raise
            tick()


def run_torchrun(cmd: list[str], env: dict[str, str], run_dir: Path, log_path: Path,
                 watchdog: subprocess.Popen[bytes], timeout: float | None,
                 tick: Callable[[], None] | None = None) -> tuple[int | None, list[str]]:
    """Run torchrun to the end; returns (exit code, last lines of its output), None on ``timeout``.

    ``tick`` is called about once a second while the ranks run (the launcher shows their progress).
    On :class:`Signalled`, KeyboardInterrupt or a timeout, torchrun and every rank are stopped
    before this returns or raises.
    """
    tail: deque[str] = deque(maxlen=400)
    with open(log_path, "a", encoding="utf-8") as log:
        with trapped_signals():
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    errors="replace", start_new_session=True, preexec_fn=_pdeathsig(signal.SIGTERM))
            torchrun = rundir.ref(proc.pid)
            tell(watchdog, f"torchrun {proc.pid} {'-' if torchrun.start is None else torchrun.start}")
            if proc.stdout is None:  # never: started with stdout=PIPE
                raise RuntimeError("torchrun was started without a pipe for its output")
            reader = threading.Thread(target=_pump, args=(proc.stdout, log, tail), daemon=True)
            reader.start()
            try:
                code: int | None = _wait(proc, timeout, tick)
            except subprocess.TimeoutExpired:
                code = None
            except BaseException:
                _stop(run_dir, torchrun, proc)
                raise
            if code is None:
                _stop(run_dir, torchrun, proc)
            else:
                rundir.stop(run_dir, None, grace_s=5.0)  # a rank that outlived torchrun (none should)
        reader.join(timeout=10)
    return code, list(tail)


__all__ = ["TRAPPED", "Signalled", "release", "run_torchrun", "start_watchdog", "tell", "trapped_signals"]
