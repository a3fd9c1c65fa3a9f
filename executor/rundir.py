"""The launcher's run directory: what every rank leaves there, and how the run's processes are stopped.

``mindpipe run`` creates a private temporary directory per run and names it to every rank in
``MINDPIPE_RUN_DIR``. Each rank registers itself there (``pids/<pid>``: its pid and start time)
and asks the kernel to kill it if its launcher (torchrun, or the one-host spawner) dies (``PR_SET_PDEATHSIG``, Linux); a rank that fails
leaves its error there (``errors/rank<N>.json``, a :class:`RankError`), which is how the launcher
reports the failing rank and its cause in one line.

:func:`stop` ends torchrun's process group and every registered rank's (SIGTERM, then SIGKILL
after a grace period); the launcher calls it when it is interrupted, and the watchdog
(:mod:`mindpipe.executor.watchdog`) when the launcher itself dies. This module does not import torch.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from mindpipe.traces.errors import ContractError
from mindpipe.traces.processes import die_with_parent

RUN_DIR_ENV = "MINDPIPE_RUN_DIR"


@dataclass(frozen=True)
class ProcRef:
    """A process, by pid and kernel start time (so a reused pid is never signalled)."""

    pid: int
    start: int | None


@dataclass(frozen=True)
class RankError:
    """What a failing rank leaves for the launcher.

    Attributes:
        rank: The global rank.
        time: When it failed (``time.time()``): the first failure is the cause.
        kind: ``input`` for a :class:`ContractError` (exit 2), ``failure`` for anything else (exit 1).
        error: One line: the contract error's text, or ``Type: first line of the message``.
        traceback: The full traceback (kept in the run's log).
    """

    rank: int
    time: float
    kind: Literal["input", "failure"]
    error: str
    traceback: str


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22); None without /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2:].split()[19])


def ref(pid: int) -> ProcRef:
    """A reference to a running process."""
    return ProcRef(pid, start_time(pid))


def alive(p: ProcRef) -> bool:
    """Whether ``p`` still runs (a zombie or a different process under the same pid counts as gone)."""
    try:
        text = Path(f"/proc/{p.pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(p.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    fields = text[text.rindex(")") + 2:].split()
    return fields[0] not in ("Z", "X") and (p.start is None or int(fields[19]) == p.start)


def signal_process(p: ProcRef, sig: int) -> None:
    """Signal ``p``'s process group if it leads one (torchrun, the spawner and every rank start their
    own), else ``p``; nothing if it is gone."""
    if not alive(p):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(p.pid) == p.pid:
            os.killpg(p.pid, sig)
        else:
            os.kill(p.pid, sig)


def ranks(run_dir: str | os.PathLike[str]) -> list[ProcRef]:
    """The ranks registered in ``run_dir``."""
    out = []
    for f in sorted((Path(run_dir) / "pids").glob("*")):
        with contextlib.suppress(OSError, ValueError):
            pid, start = f.read_text().split()
            out.append(ProcRef(int(pid), None if start == "-" else int(start)))
    return out


def stop(run_dir: str | os.PathLike[str], torchrun: ProcRef | None, grace_s: float = 10.0) -> None:
    """Stop torchrun and every rank of the run: SIGTERM, then SIGKILL whatever is left after ``grace_s``."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        procs = ([torchrun] if torchrun is not None else []) + ranks(run_dir)
        for p in procs:
            signal_process(p, sig)
        deadline = time.monotonic() + wait
        while any(alive(p) for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not any(alive(p) for p in procs):
            return


def register_rank() -> None:
    """In a rank started by ``mindpipe run``: die with torchrun (or the spawner), and leave our pid for the launcher."""
    where = os.environ.get(RUN_DIR_ENV)
    if not where:
        return
    die_with_parent()
    pids = Path(where) / "pids"
    pids.mkdir(exist_ok=True)
    start = start_time(os.getpid())
    (pids / str(os.getpid())).write_text(f"{os.getpid()} {'-' if start is None else start}\n", encoding="utf-8")


def _first_line(e: BaseException) -> str:
    first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    return f"{type(e).__name__}: {first[:500]}" if first else type(e).__name__


def _one_line(e: BaseException) -> tuple[Literal["input", "failure"], str]:
    """The error's kind and one line. A wrapper such as torch pipelining's "[Stage 0] failed to run
    forward:" (raised ``from`` the real error) is followed by its innermost cause, the error a
    user can act on; a contract error anywhere in the chain makes it an input error."""
    cause, chain = e, [e]
    while cause.__cause__ is not None and all(cause.__cause__ is not c for c in chain):
        cause = cause.__cause__
        chain.append(cause)
    contract = next((c for c in chain if isinstance(c, ContractError)), None)
    if contract is not None:  # e.g. a checkpoint DCP cannot load, raised from DCP's own exception
        return "input", next((ln for ln in str(contract).splitlines() if ln.strip()), "input error")
    if cause is e:
        return "failure", _first_line(e)
    return "failure", f"{_first_line(e)} ← {_first_line(cause)}"


def record_error(rank: int, e: BaseException) -> None:
    """Leave ``e`` for the launcher (the first record of a rank wins)."""
    where = os.environ.get(RUN_DIR_ENV)
    if not where:
        return
    kind, line = _one_line(e)
    rec = RankError(rank, time.time(), kind, line, "".join(traceback.format_exception(e, limit=30)))
    d = Path(where) / "errors"
    d.mkdir(exist_ok=True)
    with contextlib.suppress(FileExistsError):
        fd = os.open(d / f"rank{rank}.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(asdict(rec)))


def record_finished(rank: int) -> None:
    """Say that this rank got through the run's last collective (outputs written, nothing left to do
    but tear down): a crash after this point does not make the run's results wrong."""
    where = os.environ.get(RUN_DIR_ENV)
    if not where:
        return
    d = Path(where) / "finished"
    with contextlib.suppress(FileExistsError):
        d.mkdir(exist_ok=True)
        os.close(os.open(d / f"rank{rank}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


@dataclass(frozen=True)
class Progress:
    """How far a run is: the last step done of ``steps``, its loss where the reporting rank has one, and
    its wall seconds (written by one rank, shown by the launcher while it waits)."""

    step: int
    steps: int
    loss: float | None
    step_s: float
    replicas: int = 1  # data-parallel (and cp) replicas: the loss shown is replica 0's, the run's is their mean

    def line(self, unit: str = "step") -> str:
        """``step 3/10  loss 9.026575 (replica 0 of 2)  0.485 s/step``."""
        loss = "" if self.loss is None else f"  loss {self.loss:.6f}" + (
            f" (replica 0 of {self.replicas})" if self.replicas > 1 else "")
        return f"{unit} {self.step}/{self.steps}{loss}  {self.step_s:.4g} s/{unit}"


def progress_gap(elapsed_s: float) -> float:
    """Seconds between two progress lines ``elapsed_s`` into a run: a tenth of the time elapsed,
    between 1 and 60 (a two-hour run prints about 150 lines)."""
    return min(60.0, max(1.0, elapsed_s / 10))


def record_progress(progress: Progress) -> bool:
    """Replace the run's progress record (atomically: the launcher never reads half a record).

    Returns False where no launcher's run directory is set (``python -m mindpipe.executor`` under
    torchrun or srun), so the caller prints the progress itself.
    """
    where = os.environ.get(RUN_DIR_ENV)
    if not where:
        return False
    tmp = Path(where) / f".progress.{os.getpid()}"
    tmp.write_text(json.dumps(asdict(progress)), encoding="utf-8")
    os.replace(tmp, Path(where) / "progress.json")
    return True


class ProgressReporter:
    """The reporting rank's side of :class:`Progress`: after each step, at most once a ``every_s``
    (reading a loss waits for the step on a GPU) and always at the last, record it for the launcher,
    or print it on the launcher's schedule (:func:`progress_gap`) where there is none."""

    def __init__(self, steps: int, replicas: int, every_s: float = 1.0, unit: str = "step") -> None:
        self.steps, self.replicas, self.every_s, self.unit = steps, replicas, every_s, unit
        self.origin = time.perf_counter()
        self.recorded = self.printed = -math.inf

    def after(self, step: int, loss: Callable[[], float | None], step_s: float) -> None:
        """Report ``step`` (``loss`` is called only when the step is reported)."""
        now, last = time.perf_counter(), step == self.steps
        if now - self.recorded < self.every_s and not last:
            return
        progress = Progress(step, self.steps, loss(), step_s, self.replicas)
        self.recorded = now
        if not record_progress(progress) and (now - self.printed >= progress_gap(now - self.origin) or last):
            print(f"executor: {progress.line(self.unit)}", file=sys.stderr, flush=True)
            self.printed = now


def record_note(text: str) -> bool:
    """Leave a one-line note for the launcher to print (a rank's own output goes to the run's log,
    which is dropped when the run succeeds). Returns False where no launcher's run directory is set,
    so the caller prints it itself."""
    where = os.environ.get(RUN_DIR_ENV)
    if not where:
        return False
    with open(Path(where) / "notes.txt", "a", encoding="utf-8") as fh:
        fh.write(" ".join(text.split()) + "\n")
    return True


def read_notes(run_dir: str | os.PathLike[str]) -> list[str]:
    """The notes the ranks left (:func:`record_note`), in order; none before the first."""
    try:
        text = (Path(run_dir) / "notes.txt").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [line for line in text.split("\n")[:-1] if line.strip()]  # a line still being written is left


def read_progress(run_dir: str | os.PathLike[str]) -> Progress | None:
    """The run's latest :class:`Progress`, or None before the first (or from a record it cannot read)."""
    try:
        data = json.loads((Path(run_dir) / "progress.json").read_text(encoding="utf-8"))
        return Progress(int(data["step"]), int(data["steps"]), None if data["loss"] is None else float(data["loss"]),
                        float(data["step_s"]), int(data.get("replicas", 1)))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def has_finished(rank: int) -> bool:
    """Whether ``rank`` of this process's run recorded :func:`record_finished` (False outside a launched run)."""
    where = os.environ.get(RUN_DIR_ENV)
    return where is not None and (Path(where) / "finished" / f"rank{rank}").exists()


def all_finished(run_dir: str | os.PathLike[str]) -> bool:
    """Every registered rank recorded :func:`record_finished` (and at least one registered)."""
    registered = len(ranks(run_dir))
    finished = len(list((Path(run_dir) / "finished").glob("rank*")))
    return registered > 0 and finished >= registered


def describe_exit(code: int) -> str:
    """How a process ended, from its exit code (negative: the signal that killed it)."""
    return f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"


def record_root_cause(rank: int, code: int) -> None:
    """For the one-host spawner (:mod:`mindpipe.executor.spawn`): the first rank to fail and its exit
    code (negative: killed by that signal), the record torchrun prints as its "Root Cause"."""
    where = os.environ.get(RUN_DIR_ENV)
    if not where:
        return
    with contextlib.suppress(FileExistsError):
        fd = os.open(Path(where) / "root_cause.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps({"rank": rank, "exitcode": code}))


def read_root_cause(run_dir: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(rank, exit code) left by :func:`record_root_cause`, or None."""
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        d = json.loads((Path(run_dir) / "root_cause.json").read_text(encoding="utf-8"))
        return int(d["rank"]), int(d["exitcode"])
    return None


def read_errors(run_dir: str | os.PathLike[str]) -> dict[int, RankError]:
    """The errors ranks left, by rank (unreadable records are skipped: torchrun's exit record remains)."""
    out: dict[int, RankError] = {}
    for f in (Path(run_dir) / "errors").glob("rank*.json"):
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            d = json.loads(f.read_text(encoding="utf-8"))
            rec = RankError(int(d["rank"]), float(d["time"]), "input" if d["kind"] == "input" else "failure",
                            str(d["error"]), str(d["traceback"]))
            out[rec.rank] = rec
    return out


__all__ = [
    "RUN_DIR_ENV",
    "ProcRef",
    "Progress",
    "ProgressReporter",
    "RankError",
    "alive",
    "all_finished",
    "describe_exit",
    "die_with_parent",
    "has_finished",
    "progress_gap",
    "ranks",
    "read_errors",
    "read_progress",
    "read_root_cause",
    "record_error",
    "record_finished",
    "record_progress",
    "record_root_cause",
    "ref",
    "register_rank",
    "signal_process",
    "start_time",
    "stop",
]
