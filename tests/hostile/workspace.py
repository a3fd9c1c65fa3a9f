"""The workspace of one hostile-input case: its directories and the ``make`` steps that build its inputs.

Huge or special inputs are made here at run time, not committed: FIFOs (with a reader thread when
a case writes to one), symbolic links and loops, sparse multi-GiB files, gzip bombs, files of
repeated lines (a 10^6-row AICB workload, a 200 KB CSV field), permission and owner changes, and
``mindpipe`` runs a case starts from (a finished sweep to damage and resume). Loaded by
:mod:`corpus` (which re-exports :class:`Workspace` and :func:`prepare`); imports nothing of MindPipe.
"""

from __future__ import annotations

import contextlib
import os
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

INPUTS = Path(__file__).resolve().parent / "inputs"
REPO = INPUTS.parents[2]
Op = Literal["mkdir", "fifo", "symlink", "write", "append", "copy", "remove", "sparse", "repeat", "gzip_bomb", "chmod",
             "chown", "mindpipe", "truncate"]


class CaseLike(Protocol):
    """What :func:`prepare` needs of a case (:class:`corpus.Case`)."""

    argv: tuple[str, ...]
    make: tuple[dict[str, Any], ...]


@dataclass
class Workspace:
    """A case's temporary directory: ``cwd/`` (the command's working directory) and ``systmp/`` (its TMPDIR)."""

    tmp: Path
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    @property
    def cwd(self) -> Path:
        """Where the command runs."""
        return self.tmp / "cwd"

    @property
    def systmp(self) -> Path:
        """The command's temporary directory (``TMPDIR``)."""
        return self.tmp / "systmp"

    def sub(self, text: str) -> str:
        """``text`` with ``{inputs}``, ``{tmp}`` and ``{repo}`` filled in (``{}`` and other braces stay)."""
        return text.replace("{inputs}", str(INPUTS)).replace("{tmp}", str(self.tmp)).replace("{repo}", str(REPO))

    def argv(self, case: CaseLike) -> list[str]:
        """The case's arguments for this workspace."""
        return [self.sub(a) for a in case.argv]

    def close(self) -> None:
        """Release what :func:`prepare` started (FIFO readers)."""
        for fn in reversed(self.cleanups):
            fn()
        self.cleanups.clear()


def _drain_fifo(path: Path, ws: Workspace) -> None:
    """Read ``path`` in a thread until its writer closes it (what a ``cat FIFO`` would do)."""
    got: list[bytes] = []

    def read() -> None:
        with open(path, "rb") as fh:
            got.append(fh.read())

    t = threading.Thread(target=read, daemon=True)
    t.start()

    def release() -> None:
        if t.is_alive():  # nothing wrote: open and close the writing end so the reader sees EOF
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        t.join(timeout=5)

    ws.cleanups.append(release)


def _repeat(path: Path, step: dict[str, Any], ws: Workspace) -> None:
    head, line, tail = (ws.sub(step.get(k, "")).encode() for k in ("head", "line", "tail"))
    count = int(step["count"])
    with open(path, "wb") as fh:
        fh.write(head)
        chunk = line * min(count, 10_000)
        for _ in range(count // 10_000):
            fh.write(chunk)
        fh.write(line * (count % 10_000))
        fh.write(tail)


def _gzip_bomb(path: Path, size: int, prefix: bytes) -> None:
    """A gzip file that decompresses to ``prefix`` followed by zero bytes, ``size`` bytes in all."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    with open(path, "wb") as fh:
        fh.write(comp.compress(prefix))
        left = size - len(prefix)
        while left > 0:
            fh.write(comp.compress(block[: min(left, len(block))]))
            left -= len(block)
        fh.write(comp.flush())


def prepare(case: CaseLike, ws: Workspace, run_mindpipe: Callable[[list[str], Path], tuple[int, str]]) -> None:
    """Make the workspace and run the case's ``make`` steps.

    Args:
        case: The case.
        ws: Its workspace (``ws.tmp`` exists and is empty).
        run_mindpipe: Runs ``mindpipe ARGV`` in a directory and returns (exit status, stderr): a
            ``mindpipe`` step (a sweep to resume, say) must succeed.
    """
    ws.cwd.mkdir()
    ws.systmp.mkdir()
    for step in case.make:
        op = step["op"]
        path = Path(ws.sub(step.get("path", "")))
        if op == "mkdir":
            path.mkdir(parents=True, exist_ok=True)
        elif op == "fifo":
            os.mkfifo(path)
            if step.get("reader"):
                _drain_fifo(path, ws)
        elif op == "symlink":
            path.symlink_to(ws.sub(step["to"]))
        elif op == "write":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(ws.sub(step["text"]).encode())
        elif op == "append":
            with open(path, "ab") as fh:
                fh.write(ws.sub(step["text"]).encode())
        elif op == "remove":
            path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
        elif op == "copy":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(Path(ws.sub(step["src"])).read_bytes())
        elif op in ("sparse", "truncate"):
            if op == "sparse":
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            os.truncate(path, int(step["size"]) if op == "sparse" or step["size"] >= 0
                        else path.stat().st_size + int(step["size"]))
        elif op == "repeat":
            _repeat(path, step, ws)
        elif op == "gzip_bomb":
            _gzip_bomb(path, int(step["size"]), ws.sub(step.get("prefix", "")).encode())
        elif op == "chmod":
            os.chmod(path, int(step["mode"], 8))
        elif op == "chown":
            os.chown(path, int(step["uid"]), -1)
        elif op == "mindpipe":
            code, err = run_mindpipe([ws.sub(a) for a in step["argv"]], ws.cwd)
            if code != 0:
                raise RuntimeError(f"make step mindpipe {step['argv']} failed ({code}): {err[-2000:]}")


__all__ = ["INPUTS", "REPO", "CaseLike", "Op", "Workspace", "prepare"]
