"""The one reading layer: every input file MindPipe reads comes through here.

What it promises, for every kind of input (:class:`InputKind`):

* **Only regular files.** The path is ``stat``-ed before it is opened: a directory, a FIFO, a
  device (``/dev/zero``) or a socket is refused without reading a byte. The file is then opened
  non-blocking and checked again on the open descriptor, so a FIFO swapped in between the two
  cannot make the reader wait forever.
* **Bounded size.** Each kind has a byte limit (:data:`KINDS`; the README's "Limits" table); a
  larger file is refused from its ``stat`` size, and at most ``limit + 1`` bytes are ever read
  (a file that grows meanwhile is refused too). gzip data (recognised by its magic bytes,
  whatever the name) is decompressed in bounded steps and refused once its output passes the
  same limit, so a gzip bomb costs at most the limit in memory.
* **One-line errors.** Missing files, permissions, corrupt or truncated gzip bodies, text that is
  not UTF-8 (the byte offset and line are named), malformed JSON or CSV: all are
  :class:`~mindpipe.traces.errors.ContractError` naming the file.
* **Strict JSON numbers.** ``NaN``, ``Infinity``, numbers that overflow a double (``1e400``) and
  integer literals longer than :data:`MAX_INT_DIGITS` digits are refused, naming the dotted key
  where they stand (``model.json: num_layers: 1e400 is not a finite number``).

Contract-level number rules (types, ranges) are the contracts' own (:mod:`mindpipe.traces.schema`,
:mod:`mindpipe.traces.config`); the text-field parsers here (:func:`parse_int`,
:func:`parse_float`) serve the CSV and text formats.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import stat
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindpipe.traces.errors import ContractError

MIB = 1 << 20
MAX_INT_DIGITS = 20
"""Longest integer literal an input may hold: 20 digits holds any 64-bit integer (Chrome traces write
epoch nanoseconds, 19 digits); contract integers are bounded further (±2^53, :mod:`mindpipe.traces.schema`)."""
MAX_NUMBER_CHARS = 40
"""Longest number a CSV or text field may hold (``-1.2345678901234567e+308`` is 24 characters)."""


@dataclass(frozen=True)
class InputKind:
    """A kind of input file and the most bytes MindPipe reads of it (after decompression).

    Attributes:
        name: What an error calls the file (``"trace"``, ``"carbon CSV"`` ...).
        max_bytes: Size limit of the file and of its gzip-decompressed content.
    """

    name: str
    max_bytes: int


CONFIG = InputKind("model, cluster or plan JSON", 1 * MIB)
CALIBRATION = InputKind("calibration", 16 * MIB)
TRACE = InputKind("trace", 64 * MIB)
CHROME_TRACE = InputKind("torch.profiler Chrome trace", 128 * MIB)
AICB = InputKind("AICB workload", 8 * MIB)
CARBON_CSV = InputKind("carbon-intensity CSV", 32 * MIB)
VTRAIN_CSV = InputKind("vTrain CSV", 16 * MIB)
NEMO_CSV = InputKind("NeMo performance CSV", 1 * MIB)
CATALOG = InputKind("hardware catalog", 4 * MIB)
CONSTANTS = InputKind("constants file", 4 * MIB)
ACTION_TABLE = InputKind("action table CSV", 16 * MIB)
TEXT_DATA = InputKind("training text", 64 * MIB)
SWEEP_STATE = InputKind("sweep state", 256 * MIB)
"""``tune``'s ``sweep.json`` and ``evaluations.jsonl`` (about 1.2 KB a line: the 100,000-simulation budget fits)."""
KINDS = (CONFIG, CALIBRATION, TRACE, CHROME_TRACE, AICB, CARBON_CSV, VTRAIN_CSV, NEMO_CSV, CATALOG, CONSTANTS, ACTION_TABLE,
         TEXT_DATA, SWEEP_STATE)
"""Every kind, for the README's table and its test."""

_GZIP_MAGIC = b"\x1f\x8b"
_WHOLE = re.compile(rf"([+-]?\d{{1,{MAX_INT_DIGITS}}})(?:\.0*)?")
_FILE_TYPES = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def size_text(n: int) -> str:
    """``1 MiB``, ``64 MiB``, ``512 KiB`` or ``123 bytes``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n} bytes"


def _not_regular(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory"
    what = next((name for test, name in _FILE_TYPES if test(mode)), "not a regular file")
    return f"is {what}, not a regular file"


def _os_error(source: str, e: OSError) -> ContractError:
    if isinstance(e, FileNotFoundError | NotADirectoryError):
        return ContractError(source, None, "file not found")
    if isinstance(e, PermissionError):
        return ContractError(source, None, "permission denied")
    return ContractError(source, None, f"cannot read file ({e.strerror or e.__class__.__name__})")


def check_regular_file(path: str | os.PathLike[str], kind: InputKind, source: str | None = None) -> int:
    """Refuse ``path`` unless it is a regular file within the kind's size limit; return its size.

    Nothing is opened: this is the check every reader makes before it opens a file.

    Raises:
        ContractError: missing, unreadable, not a regular file, or larger than ``kind.max_bytes``.
    """
    src = source or os.fspath(path)
    try:
        st = os.stat(path)
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        raise (_os_error(src, e) if isinstance(e, OSError) else ContractError(src, None, "not a valid path")) from None
    why = _not_regular(st.st_mode)
    if why is not None:
        raise ContractError(src, None, f"{why}; {kind.name} input is read from regular files only")
    if st.st_size > kind.max_bytes:
        raise ContractError(src, None, f"file is {size_text(st.st_size)}; {kind.name} input may be at most "
                                       f"{size_text(kind.max_bytes)} (limit)")
    return st.st_size


def read_bytes(path: str | os.PathLike[str], kind: InputKind, source: str | None = None) -> bytes:
    """The file's bytes (gzip-decompressed when it starts with gzip's magic), within ``kind``'s limit.

    Raises:
        ContractError: see :func:`check_regular_file`; also a file that grew past the limit while
            read, and corrupt, truncated or oversized gzip data.
    """
    src = source or os.fspath(path)
    check_regular_file(path, kind, src)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise _os_error(src, e) from None
    with os.fdopen(fd, "rb") as fh:
        why = _not_regular(os.fstat(fd).st_mode)  # the path may have been swapped since the stat
        if why is not None:
            raise ContractError(src, None, f"{why}; {kind.name} input is read from regular files only")
        try:
            data = fh.read(kind.max_bytes + 1)
        except OSError as e:
            raise _os_error(src, e) from None
    if len(data) > kind.max_bytes:
        raise ContractError(src, None, f"file grew past {size_text(kind.max_bytes)} while read (limit)")
    if data[:2] == _GZIP_MAGIC:
        return gunzip(data, kind, src)
    if Path(src).suffix == ".gz":
        raise ContractError(src, None, "corrupt gzip data: the file ends in .gz but has no gzip header")
    return data


def gunzip(data: bytes, kind: InputKind, source: str) -> bytes:
    """Decompress gzip ``data`` (one or more members), never producing more than ``kind.max_bytes``.

    Raises:
        ContractError: corrupt or truncated data, or output past the limit (a gzip bomb).
    """
    out = bytearray()
    rest = data
    while rest:
        d = zlib.decompressobj(wbits=31)
        try:
            out += d.decompress(rest, kind.max_bytes + 1 - len(out))
        except zlib.error as e:
            raise ContractError(source, None, f"corrupt gzip data ({e})") from None
        if len(out) > kind.max_bytes or d.unconsumed_tail:
            raise ContractError(source, None, f"gzip data decompresses to more than {size_text(kind.max_bytes)}, "
                                              f"the most {kind.name} input may hold (limit)")
        if not d.eof:
            raise ContractError(source, None, "corrupt gzip data: truncated (the compressed stream does not end)")
        rest = d.unused_data
        if rest.strip(b"\x00") == b"":  # gzip allows zero padding after the last member
            break
    return bytes(out)


def decode_text(data: bytes, source: str) -> str:
    """UTF-8 text (a leading byte-order mark is dropped).

    Raises:
        ContractError: naming the offset and line of the first byte that is not UTF-8.
    """
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ContractError(source, f"line {line}", f"line {line}: not UTF-8 text (byte 0x{data[e.start]:02x} at "
                                                    f"offset {e.start})") from None


def read_text(path: str | os.PathLike[str], kind: InputKind, source: str | None = None) -> str:
    """:func:`read_bytes` decoded as UTF-8."""
    src = source or os.fspath(path)
    return decode_text(read_bytes(path, kind, src), src)


class _Bad(str):
    """A JSON number token the strict parser refuses (kept as text until its key is known)."""


def _locate(doc: Any, path: str = "") -> tuple[str, _Bad] | None:
    """The dotted key of the first refused token in ``doc``."""
    stack: list[tuple[str, Any]] = [(path, doc)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, _Bad):
            return where, value
        if isinstance(value, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(value))))
    return None


def parse_json(text: str, source: str, unique_keys: bool = False, non_finite: bool = False) -> Any:
    """Parse JSON text with strict numbers (see the module docstring).

    Args:
        text: The JSON text.
        source: The file (or label) errors name.
        unique_keys: Refuse an object that names a key twice (JSON keeps the last silently).
        non_finite: Accept the tokens ``NaN``, ``Infinity`` and ``-Infinity`` (state MindPipe wrote
            itself with ``allow_nan``); overflowing literals and over-long integers are still refused.

    Raises:
        ContractError: malformed JSON (line and column), too deeply nested, a refused number (its
            dotted key), or with ``unique_keys`` a repeated key.
    """
    bad: list[bool] = []

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ContractError(source, key, f"duplicate key {key!r}")
            out[key] = value
        return out

    def refuse(token: str) -> _Bad:
        bad.append(True)
        return _Bad(token)

    def number(token: str) -> float | _Bad:
        value = float(token)
        return value if math.isfinite(value) else refuse(token)

    def integer(token: str) -> int | _Bad:
        return refuse(token) if len(token) > MAX_INT_DIGITS + (token[0] == "-") else int(token)

    try:
        doc = json.loads(text, parse_float=number, parse_int=integer, parse_constant=float if non_finite else refuse,
                         object_pairs_hook=no_duplicates if unique_keys else None)
    except json.JSONDecodeError as e:
        raise ContractError(source, None, f"malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise ContractError(source, None, "malformed JSON: nested too deeply") from None
    if bad:
        where, token = _locate(doc) or ("", _Bad("?"))
        shown = token if len(token) <= 24 else f"{token[:12]}...({len(token)} characters)"
        if token[-1:].isdigit() and re.fullmatch(r"-?\d+", token):
            rule = f"{shown} has more than {MAX_INT_DIGITS} digits (limit)"
        else:
            rule = f"{shown} is not a finite number"
        raise ContractError(source, where or None, f"{where}: {rule}" if where else rule)
    return doc


def read_json(path: str | os.PathLike[str], kind: InputKind, source: str | None = None,
              unique_keys: bool = False) -> Any:
    """A JSON file (plain or gzip) within ``kind``'s limit, with strict numbers (see :func:`parse_json`)."""
    src = source or os.fspath(path)
    return parse_json(read_text(path, kind, src), src, unique_keys)


def read_csv(path: str | os.PathLike[str], kind: InputKind, source: str | None = None,
             max_rows: int | None = None, on_header: Callable[[list[str]], None] | None = None) -> list[list[str]]:
    """The rows of a CSV file within ``kind``'s limit (and at most ``max_rows`` rows after the header line).

    ``on_header`` is called with the first row as soon as it is read, so a file of another format
    is refused by its header rather than by a later limit.

    Raises:
        ContractError: see :func:`read_text`; also malformed CSV (e.g. a field longer than the csv
            module's 128 KiB field limit) and too many rows, naming the line.
    """
    src = source or os.fspath(path)
    reader = csv.reader(io.StringIO(read_text(path, kind, src), newline=""))
    rows: list[list[str]] = []
    try:
        for row in reader:
            rows.append(row)
            if on_header is not None and len(rows) == 1:
                on_header(row)
            if max_rows is not None and len(rows) > max_rows + 1:
                raise ContractError(src, f"line {reader.line_num}", f"more than {max_rows} rows after the header "
                                                                    "(limit)")
    except csv.Error as e:
        line = reader.line_num
        raise ContractError(src, f"line {line}", f"line {line}: malformed CSV ({e})") from None
    return rows



def read_headed_csv(path: str | os.PathLike[str], kind: InputKind, header_for: Callable[[list[str]], list[str]],
                    max_rows: int | None = None, sep: str = ", ") -> list[tuple[str, dict[str, str]]]:
    """The data rows of a CSV whose first line names its columns, as ``(<file>:<line>, {column: cell})``.

    Cells are stripped; blank lines are skipped. The header must hold exactly the expected
    columns, each once, in any order (cells are returned by name, so a file written with its
    columns in another order reads the same rows); a header that differs is refused naming the
    missing and the unexpected columns.

    Args:
        path, kind, max_rows: As :func:`read_csv`.
        header_for: Given the file's stripped header, the header it must have (a file format with
            optional leading columns decides from what it sees).
        sep: Joins the expected header in the error message.

    Raises:
        ContractError: an empty file, a header other than ``header_for``'s, a row with another
            number of fields, or no data rows — naming ``<file>:<line>``.
    """
    src = os.fspath(path)

    def check_header(first: list[str]) -> None:
        header = [c.strip() for c in first]
        expected = header_for(header)
        if sorted(header) == sorted(expected) and len(set(header)) == len(header):
            return
        seen, wanted = set(header), set(expected)
        missing = [c for c in expected if c not in seen]
        unexpected = list(dict.fromkeys(c for c in header if c not in wanted))[:5]  # a foreign file may have many
        repeated = sorted(c for c, n in Counter(header).items() if n > 1)[:5]
        detail = "; ".join(f"{what} column{'s' if len(cols) > 1 else ''} {', '.join(_clip(c) for c in cols)}"
                           for what, cols in (("missing", missing), ("unexpected", unexpected), ("repeated", repeated))
                           if cols) if seen & wanted else ""  # another format: the header says enough
        raise ContractError(src, "line 1", f"header must be: {sep.join(expected)}" + (f" ({detail})" if detail else ""))

    rows = read_csv(path, kind, max_rows=max_rows, on_header=check_header)
    if not rows:
        raise ContractError(src, "line 1", "empty file")
    header = [c.strip() for c in rows[0]]
    out = []
    for lineno, cells in enumerate(rows[1:], start=2):
        if not cells or not any(c.strip() for c in cells):
            continue
        where = f"{src}:{lineno}"
        if len(cells) != len(header):
            raise ContractError(where, None, f"expected {len(header)} fields, got {len(cells)}")
        out.append((where, dict(zip(header, (c.strip() for c in cells), strict=True))))
    if not out:
        raise ContractError(src, None, "no data rows")
    return out

def _clip(text: str) -> str:
    return repr(text) if len(text) <= 24 else repr(text[:12] + "...") + f" ({len(text)} characters)"


def parse_float(text: str, source: str, key: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    """A number field of a text format: finite and within ``[lo, hi]``.

    Raises:
        ContractError: ``source: key: 'x' is not a number`` (or not finite, or out of range).
    """
    t = text.strip()
    try:
        value = float(t) if len(t) <= MAX_NUMBER_CHARS else math.nan
    except ValueError:
        raise ContractError(source, key, f"{key}: {_clip(t)} is not a number") from None
    if not math.isfinite(value):
        raise ContractError(source, key, f"{key}: {_clip(t)} is not a finite number")
    if not lo <= value <= hi:
        raise ContractError(source, key, f"{key}: {t} is outside [{lo:g}, {hi:g}]")
    return value


def parse_int(text: str, source: str, key: str, lo: int, hi: int) -> int:
    """A whole-number field of a text format (``12``, or ``12.0`` as some tools write it) in ``[lo, hi]``.

    Raises:
        ContractError: ``source: key: '1e300' is not a whole number in [lo, hi]``.
    """
    t = text.strip()
    m = _WHOLE.fullmatch(t)
    if m is None or not lo <= int(m[1]) <= hi:
        raise ContractError(source, key, f"{key}: {_clip(t)} is not a whole number in [{lo}, {hi}]")
    return int(m[1])


__all__ = [
    "ACTION_TABLE",
    "AICB",
    "CALIBRATION",
    "CARBON_CSV",
    "CATALOG",
    "CHROME_TRACE",
    "CONFIG",
    "CONSTANTS",
    "KINDS",
    "MAX_INT_DIGITS",
    "NEMO_CSV",
    "SWEEP_STATE",
    "TEXT_DATA",
    "TRACE",
    "VTRAIN_CSV",
    "InputKind",
    "check_regular_file",
    "decode_text",
    "gunzip",
    "parse_float",
    "parse_int",
    "parse_json",
    "read_bytes",
    "read_csv",
    "read_headed_csv",
    "read_json",
    "read_text",
    "size_text",
]
