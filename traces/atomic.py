"""Safe writes: the one way MindPipe writes an output file.

Every writer (contracts, tables, plots, sweep state, checkpoints' records, run logs) goes through
:func:`open_output` (or :func:`write_text` / :func:`write_bytes`), which decides by what the
target *is* (``os.stat``, following symbolic links as a shell redirection would):

* nothing there, or a regular file: the data goes to a temporary file created exclusively
  (``O_CREAT | O_EXCL | O_NOFOLLOW``, random hidden name) in the target's own directory, is
  fsync'ed, and is renamed over the target only if the target is still a regular file or nothing.
  A planted ``<out>.tmp`` (symbolic link or not) is never opened; a failed write removes its
  temporary file. A symbolic link to a regular file is followed: its target is replaced and the
  link stays a link. A replaced file keeps its permission bits.
* a character device (``/dev/null``, a terminal) or a FIFO: written in place, as ``> path`` in a
  shell would (never replaced by a regular file). A FIFO nobody reads is waited for at most
  :data:`FIFO_WAIT_S` seconds, then refused.
* a directory, a block device, a socket, a dangling symbolic link: refused with one line
  (:class:`~mindpipe.traces.errors.ContractError`, exit 2), before anything is written.

Directory outputs (``tune --out DIR``) go through :func:`output_dir`; append-only logs (the
sweep's evaluations) through :func:`open_append`, which refuses anything but a regular file;
matplotlib figures through :func:`save_figure`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Literal

from mindpipe.traces.errors import ContractError

FIFO_WAIT_S = 10.0  # how long a FIFO target may go without a reader before the write is refused
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

Kind = Literal["new", "regular", "stream"]


def _what(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def _stat_target(p: Path, dangling: str, sep: str) -> os.stat_result | None:
    """``os.stat`` of an output path (following links); None if nothing is there.

    Raises:
        ContractError: a dangling link (``is a symbolic link to nothing{sep}{dangling}``) or a parent
            that is not a directory.
    """
    try:
        return os.stat(p)
    except FileNotFoundError:
        if os.path.islink(p):
            raise ContractError(str(p), None, f"is a symbolic link to nothing{sep}{dangling}") from None
        return None
    except NotADirectoryError:
        raise ContractError(str(p), None, "a parent of this path is not a directory") from None


def _file_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a file to write; a name ending in a separator is refused (``Path("out/")`` is ``out``)."""
    text = os.fspath(path)
    if isinstance(text, str) and text.endswith(("/", os.sep)) and text.strip("/" + os.sep):
        raise ContractError(text, None, "ends with a path separator, so names a directory; name the file to write")
    return Path(path)


def classify(path: str | os.PathLike[str]) -> tuple[Kind, Path]:
    """What writing ``path`` means: ``(kind, where)``; ``where`` is the file to replace.

    Raises:
        ContractError: ``path`` is a directory, block device, socket or dangling link, or a
            parent of it is not a directory.
    """
    p = _file_path(path)
    st = _stat_target(p, "refusing to write through it", ": ")
    if st is None:
        return "new", p
    if stat.S_ISREG(st.st_mode):
        if not os.path.islink(p):
            return "regular", p
        real = Path(os.path.realpath(p))
        try:
            same = os.stat(real, follow_symlinks=False)
        except OSError:
            same = None
        if same is not None and (same.st_dev, same.st_ino) == (st.st_dev, st.st_ino):
            return "regular", real
        return "stream", p  # a link the file system cannot name (/proc/self/fd/N): write through it
    if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return "stream", p
    what = _what(st.st_mode)
    expected = "expected a file" if stat.S_ISDIR(st.st_mode) else "refusing to write it"
    raise ContractError(str(p), None, f"is {what}, {expected}")


def _open_stream(p: Path) -> int:
    """Open a device or FIFO for writing, in place; a FIFO must find a reader within FIFO_WAIT_S."""
    flags = os.O_WRONLY | _CLOEXEC | getattr(os, "O_NOCTTY", 0)
    try:
        if not stat.S_ISFIFO(os.stat(p).st_mode):
            return os.open(p, flags)
    except OSError as e:
        raise ContractError(str(p), None, f"cannot open for writing: {e.strerror}") from None
    deadline = time.monotonic() + FIFO_WAIT_S
    while True:
        try:
            fd = os.open(p, flags | os.O_NONBLOCK)  # ENXIO while nobody has it open for reading
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise ContractError(str(p), None, f"cannot open for writing: {e.strerror}") from None
            if time.monotonic() > deadline:
                raise ContractError(str(p), None, f"is a FIFO that nothing read within {FIFO_WAIT_S:g} s") from None
            time.sleep(0.05)
            continue
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return fd


def _create_temp(target: Path) -> tuple[int, Path]:
    """A new file beside ``target``, created exclusively under a random name (never a planted one)."""
    for _ in range(100):
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o666), tmp
        except FileExistsError:
            continue
        except FileNotFoundError:
            if target.parent.is_dir():  # a file system that makes no such files (/proc)
                raise ContractError(str(target), None, f"cannot create a file in {target.parent}") from None
            raise ContractError(str(target), None, f"directory {target.parent} does not exist") from None
        except OSError as e:
            raise ContractError(str(target), None, f"cannot create a file in {target.parent}: {e.strerror}") from None
    raise ContractError(str(target), None, "cannot create a temporary file beside it")  # pragma: no cover


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _wrap(fd: int, binary: bool, encoding: str, newline: str | None) -> IO:
    if binary:
        return open(fd, "wb", closefd=True)
    return open(fd, "w", encoding=encoding, newline=newline, closefd=True)


@contextlib.contextmanager
def open_output(path: str | os.PathLike[str], *, binary: bool = False, encoding: str = "utf-8",
                newline: str | None = None, make_parents: bool = False) -> Iterator[IO]:
    """Open ``path`` for writing its whole new content (see the module docstring for the rules).

    Args:
        path: The output file.
        binary: Yield a binary file object (default text).
        encoding, newline: For text mode, as :func:`open`.
        make_parents: Create missing parent directories first.

    Yields:
        A file object; the content replaces the target when the block ends without an error.

    Raises:
        ContractError: the target is refused (directory, block device, socket, dangling link,
            missing parent, unwritable directory, a FIFO without a reader).
    """
    kind, target = classify(path)
    if kind == "stream":
        fh = _wrap(_open_stream(target), binary, encoding, newline)
        with fh:
            yield fh
        return
    if make_parents and not target.parent.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(target)
    try:
        fh = _wrap(fd, binary, encoding, newline)
        with fh:
            yield fh
            fh.flush()
            if kind == "regular":
                with contextlib.suppress(OSError):
                    os.fchmod(fh.fileno(), stat.S_IMODE(os.stat(target).st_mode))
            os.fsync(fh.fileno())
        try:  # the target may have changed kind while we wrote: replace only a regular file or nothing
            now = os.lstat(target).st_mode
        except FileNotFoundError:
            now = None
        if now is not None and not stat.S_ISREG(now):
            raise ContractError(str(target), None, f"became {_what(now)} while it was being written; left as it is")
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(target.parent)


def write_text(path: str | os.PathLike[str], text: str, *, make_parents: bool = False) -> None:
    """Write ``text`` (UTF-8) to ``path`` safely (:func:`open_output`)."""
    with open_output(path, make_parents=make_parents) as fh:
        fh.write(text)


def write_bytes(path: str | os.PathLike[str], data: bytes, *, make_parents: bool = False) -> None:
    """Write ``data`` to ``path`` safely (:func:`open_output`)."""
    with open_output(path, binary=True, make_parents=make_parents) as fh:
        fh.write(data)


def figure(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float] | None = None, **subplots: Any) -> tuple[Any, Any]:
    """A matplotlib figure and its axes, as ``pyplot.subplots`` gives them, but without pyplot.

    No backend is chosen or switched (``matplotlib.use("Agg")`` in a library call turned a notebook's
    inline plots off for the rest of its session), no figure is registered with pyplot, so nothing
    needs closing; :func:`save_figure` writes it in any format matplotlib has.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **subplots)


def save_figure(fig: Any, path: str | os.PathLike[str], *, dpi: int = 100, make_parents: bool = True) -> None:
    """Save a matplotlib figure safely, in the format its file name ends with (``.png`` by default).

    Raises:
        ContractError: the extension names no format matplotlib writes, or the target is refused.
    """
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    formats = fig.canvas.get_supported_filetypes()
    if fmt not in formats:
        raise ContractError(str(path), None, f"unsupported image format .{fmt} (supported: "
                            f"{', '.join('.' + f for f in sorted(formats))})")
    with open_output(path, binary=True, make_parents=make_parents) as fh:
        fig.savefig(fh, format=fmt, dpi=dpi)


def check_output(path: str | os.PathLike[str], *, directory: bool = False) -> bool:
    """Refuse an output that :func:`open_output` (``directory``: :func:`output_dir`) would refuse, writing nothing.

    Commands call it for every output they were given before their work starts, so a bad ``--out``
    costs nothing (a profile or a fit is not run only to be thrown away).

    Returns:
        Whether something is there already.

    Raises:
        ContractError: as the writer would (a directory where a file is meant, a dangling link, a
            file where a directory is meant, a parent that is not a directory).
    """
    if not directory:
        kind, where = classify(path)
        if kind != "stream" and where.parent.is_dir():
            # What the writer will do first: create a file beside it (a read-only or unwritable
            # directory is refused now, not after the work).
            fd, tmp = _create_temp(where)
            os.close(fd)
            os.unlink(tmp)
        return kind != "new"
    p = Path(path)
    st = _stat_target(p, "expected a directory", ", ")
    if st is None:
        return False
    if not stat.S_ISDIR(st.st_mode):
        raise ContractError(str(p), None, f"is {_what(st.st_mode)}, expected a directory")
    return True


def output_dir(path: str | os.PathLike[str]) -> Path:
    """An output directory: created if missing (with its parents), refused if something else is there.

    Raises:
        ContractError: ``path`` exists and is not a directory (or a link to one).
    """
    p = Path(path)
    if not check_output(p, directory=True):
        try:
            p.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ContractError(str(p), None, "a parent of this path is not a directory") from None
        except OSError as e:  # e.g. no permission, a read-only file system, /proc or /sys
            raise ContractError(str(p), None, f"cannot create this directory ({e.strerror})") from None
    return p


def open_append(path: str | os.PathLike[str]) -> IO[str]:
    """Open a regular file (created if missing) for appending UTF-8 text; links and devices are refused.

    Raises:
        ContractError: ``path`` is not a regular file, or a symbolic link.
    """
    p = _file_path(path)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP or os.path.islink(p):
            raise ContractError(str(p), None, "is a symbolic link: refusing to append through it") from None
        if e.errno == errno.EISDIR:
            raise ContractError(str(p), None, "is a directory, expected a file") from None
        if e.errno == errno.ENXIO:
            raise ContractError(str(p), None, "is a FIFO, expected a regular file") from None
        raise ContractError(str(p), None, f"cannot open for appending: {e.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ContractError(str(p), None, f"is {_what(mode)}, expected a regular file")
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return open(fd, "a", encoding="utf-8", closefd=True)


__all__ = ["FIFO_WAIT_S", "check_output", "classify", "figure", "open_append", "open_output", "output_dir", "save_figure", "write_bytes",
           "write_text"]
