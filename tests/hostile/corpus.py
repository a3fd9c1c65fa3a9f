"""The hostile-input corpus of issue 15: the case table, the inputs made at run time, the rules every outcome keeps.

``cases.toml`` names each case: its class (the issue's five), the ``mindpipe`` arguments (with
``{inputs}``, ``{tmp}`` and ``{repo}`` standing for this folder's ``inputs/``, the case's own
temporary directory and the repository), the exit status it must end with (2: refused as bad
input; 0: the input is legal and the answer is checked), the text its one stderr line must hold,
the ``make`` steps that build huge or special inputs at run time (FIFOs, sparse multi-GiB files,
gzip bombs, a 10^6-row AICB workload, a checkpoint, a sweep to resume), the state the files must
be in ``after`` it, and the ``json`` values its ``--json`` answer must hold.

Both ``tests/test_hostile_corpus.py`` (in-process, through :func:`mindpipe.cli.main`) and
``benchmarks/hostile_corpus.py`` (one child process per case) use this module: :func:`load_cases`,
:func:`prepare` (from ``workspace.py``, re-exported) and :func:`problems`. It imports nothing of MindPipe.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import stat
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
INPUTS = HERE / "inputs"
TABLE = HERE / "cases.toml"

# workspace.py beside this file (tests/ is not a package: loaded from its path, kept in sys.modules for dataclasses).
_SPEC = importlib.util.spec_from_file_location("hostile_workspace", HERE / "workspace.py")
assert _SPEC is not None and _SPEC.loader is not None
_workspace = sys.modules.get(_SPEC.name)
if _workspace is None:
    _workspace = sys.modules[_SPEC.name] = importlib.util.module_from_spec(_SPEC)
    _SPEC.loader.exec_module(_workspace)
Workspace = _workspace.Workspace
prepare = _workspace.prepare

CaseClass = Literal["traceback", "silently-wrong", "unbounded", "files", "trust-process"]
FileKind = Literal["absent", "file", "dir", "fifo", "char", "link"]
SUBCOMMANDS = ("profile", "import", "inspect", "simulate", "tune", "validate", "calibrate", "demo", "run")
"""``mindpipe --help``'s commands (the test holds this to :data:`mindpipe.cli.SUBCOMMANDS`)."""
ERROR_PREFIX = "mindpipe: error: "
DEFAULT_TIMEOUT_S = 60
_LEFTOVER = re.compile(r"^\..+\.[0-9a-f]{12}\.tmp$")  # mindpipe.traces.atomic's temporary names


@dataclass(frozen=True)
class After:
    """What a path must be once the case has run (``text``: its exact content, when given)."""

    path: str
    kind: FileKind
    text: str | None = None


@dataclass(frozen=True)
class Case:
    """One row of ``cases.toml`` (see the module docstring)."""

    id: str
    cls: CaseClass
    argv: tuple[str, ...]
    exit: Literal[0, 2]
    stderr: str
    make: tuple[dict[str, Any], ...] = ()
    after: tuple[After, ...] = ()
    json: dict[str, Any] = field(default_factory=dict)
    subprocess: bool = False
    timeout: int = DEFAULT_TIMEOUT_S

    @property
    def command(self) -> str:
        """The subcommand (the first argument), or ``(none)`` (no subcommand, or not one)."""
        return self.argv[0] if self.argv and self.argv[0] in SUBCOMMANDS else "(none)"

    @property
    def wants_json(self) -> bool:
        """Whether the command was asked for one JSON object on stdout."""
        return "--json" in self.argv


_KEYS = {"id", "class", "argv", "exit", "stderr", "make", "after", "json", "subprocess", "timeout", "why"}


def _case(row: dict[str, Any]) -> Case:
    unknown = set(row) - _KEYS
    where = row.get("id", "?")
    if unknown or not {"id", "class", "argv", "exit"} <= set(row):
        raise ValueError(f"cases.toml: {where}: unknown keys {sorted(unknown)} or missing id/class/argv/exit")
    if row["class"] not in get_args(CaseClass) or row["exit"] not in (0, 2):
        raise ValueError(f"cases.toml: {where}: class must be one of {get_args(CaseClass)}, exit 0 or 2")
    if row["exit"] == 2 and not row.get("stderr"):
        raise ValueError(f"cases.toml: {where}: a refused case names the text its error line must hold")
    for step in row.get("make", []):
        if step.get("op") not in get_args(_workspace.Op):
            raise ValueError(f"cases.toml: {where}: unknown make op {step.get('op')!r}")
    after = tuple(After(a["path"], a["is"], a.get("text")) for a in row.get("after", []))
    if any(a.kind not in get_args(FileKind) for a in after):
        raise ValueError(f"cases.toml: {where}: after.is must be one of {get_args(FileKind)}")
    return Case(id=row["id"], cls=row["class"], argv=tuple(row["argv"]), exit=row["exit"], stderr=row.get("stderr", ""),
                make=tuple(row.get("make", [])), after=after, json=dict(row.get("json", {})),
                subprocess=bool(row.get("subprocess", False)), timeout=int(row.get("timeout", DEFAULT_TIMEOUT_S)))


def load_cases(path: Path = TABLE) -> list[Case]:
    """Every case of the table, checked (unique ids, known classes, exit 0 or 2)."""
    rows = tomllib.loads(path.read_text(encoding="utf-8"))["case"]
    cases = [_case(r) for r in rows]
    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        raise ValueError(f"cases.toml: repeated ids {sorted({i for i in ids if ids.count(i) > 1})}")
    return cases


@dataclass(frozen=True)
class Outcome:
    """What one run of a case gave: exit status, stdout, stderr (a traceback escaping ``main`` is stderr)."""

    code: int
    stdout: str
    stderr: str


def _reject(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def _dig(doc: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def _kind(path: str) -> FileKind:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "absent"
    for test, name in ((stat.S_ISLNK, "link"), (stat.S_ISDIR, "dir"), (stat.S_ISFIFO, "fifo"), (stat.S_ISCHR, "char")):
        if test(st.st_mode):
            return name  # type: ignore[return-value]
    return "file"


def _json_problems(case: Case, out: Outcome) -> list[str]:
    try:
        doc = json.loads(out.stdout, parse_constant=_reject)
    except ValueError as e:
        return [f"--json stdout is not one strict JSON object ({e}): {out.stdout[:300]!r}"]
    if not isinstance(doc, dict):
        return [f"--json stdout is a {type(doc).__name__}, not an object"]
    found = []
    for key, want in case.json.items():
        try:
            got = _dig(doc, key)
        except (KeyError, IndexError, TypeError, ValueError):
            found.append(f"--json answer has no {key}")
            continue
        same = math.isclose(got, want, rel_tol=1e-6) if isinstance(want, float) and isinstance(got, int | float) \
            else got == want
        if not same:
            found.append(f"--json {key} is {got!r}, expected {want!r} (silently wrong)")
    return found


def problems(case: Case, out: Outcome, ws: Workspace) -> list[str]:
    """Every rule of issue 15 that ``out`` breaks (empty: the case passes)."""
    found: list[str] = []
    if out.code not in (0, 2):
        found.append(f"exit status {out.code} (only 0 or 2 are allowed)")
    elif out.code != case.exit:
        found.append(f"exit status {out.code}, expected {case.exit}")
    if "Traceback" in out.stderr or "Traceback" in out.stdout:
        found.append("a traceback was printed")
    lines = out.stderr.splitlines()
    if out.code == 2:
        if len(lines) != 1 or not out.stderr.endswith("\n"):
            found.append(f"stderr has {len(lines)} lines, expected exactly one")
        if not out.stderr.startswith(ERROR_PREFIX):
            found.append(f"stderr does not start with {ERROR_PREFIX!r}")
        if out.stdout:
            found.append(f"stdout is not empty on a refusal: {out.stdout[:200]!r}")
    if case.stderr and ws.sub(case.stderr) not in out.stderr:
        found.append(f"stderr lacks {ws.sub(case.stderr)!r}")
    if out.code == 0 and case.wants_json:
        found += _json_problems(case, out)
    for a in case.after:
        kind = _kind(ws.sub(a.path))
        if kind != a.kind:
            found.append(f"{ws.sub(a.path)} is {kind}, expected {a.kind}")
        elif a.text is not None and Path(ws.sub(a.path)).read_text() != ws.sub(a.text):
            found.append(f"{ws.sub(a.path)} was changed")
    planted = {Path(ws.sub(s["path"])).name for s in case.make if "path" in s}
    for root, dirs, files in os.walk(ws.tmp):
        for name in dirs + files:
            if _LEFTOVER.match(name) and name not in planted:
                found.append(f"temporary file left behind: {Path(root) / name}")
    # torch keeps its compiler cache in TMPDIR/torchinductor_<user> on purpose (a cache, not MindPipe's file).
    left = sorted(p.name for p in ws.systmp.iterdir() if not p.name.startswith("torchinductor_")) \
        if ws.systmp.is_dir() else []
    if left:
        found.append(f"left in TMPDIR: {left}")
    return found


def snapshot() -> dict[str, tuple[int, int]]:
    """Size and mtime of every file under ``inputs/`` and every entry of the repository root (nothing may change)."""
    snap = {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in INPUTS.rglob("*") if p.is_file()}
    snap.update({str(p): (0, 0) for p in REPO.iterdir()})
    return snap


__all__ = ["DEFAULT_TIMEOUT_S", "ERROR_PREFIX", "INPUTS", "REPO", "SUBCOMMANDS", "After", "Case", "CaseClass", "Outcome", "Workspace",
           "load_cases", "prepare", "problems", "snapshot"]
