"""Issue 15's hostile-input corpus (``tests/hostile/cases.toml``): every command keeps its promise on every case.

Each case runs in its own temporary directory, in-process through :func:`mindpipe.cli.main` (a
few as ``python -m mindpipe.cli`` child processes), and must: end with its expected exit status
(always 0 or 2), print exactly one ``mindpipe: error: `` line on stderr when refused (holding the
case's text: the file and the key), never a traceback, print one strict JSON object on stdout with
``--json``, leave its files as the case says, leave no temporary file, and write nothing outside
its directory. The rules are :func:`corpus.problems`; the benchmark (``benchmarks/hostile_corpus.py``)
runs the same table in child processes and measures time and memory.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import pytest

from mindpipe.cli import main

# tests/ is not a package: load the corpus module from its file (dataclasses need it in sys.modules).
_PATH = Path(__file__).resolve().parent / "hostile" / "corpus.py"
_SPEC = importlib.util.spec_from_file_location("hostile_corpus", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
corpus = sys.modules[_SPEC.name] = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(corpus)

CASES = corpus.load_cases()


def _in_process(argv: list[str], capfd: pytest.CaptureFixture[str]) -> corpus.Outcome:
    """``main(argv)``; an exception escaping it is what a user would see: a traceback."""
    try:
        code = main(argv)
    except SystemExit as e:  # main() must return, not exit; the status is what the shell would see
        code = e.code if isinstance(e.code, int) else 1
    except Exception:  # the very thing the corpus looks for (timeouts and Ctrl-C pass through)
        cap = capfd.readouterr()
        return corpus.Outcome(1, cap.out, cap.err + traceback.format_exc())
    cap = capfd.readouterr()
    return corpus.Outcome(code, cap.out, cap.err)


def _child(argv: list[str], ws: corpus.Workspace, timeout: float) -> corpus.Outcome:
    env = {**os.environ, "TMPDIR": str(ws.systmp)}
    res = subprocess.run([sys.executable, "-m", "mindpipe.cli", *argv], capture_output=True, text=True, cwd=ws.cwd,
                         env=env, timeout=timeout)
    return corpus.Outcome(res.returncode, res.stdout, res.stderr)


@pytest.fixture()
def workspace(tmp_path):
    """The case's workspace; the command runs in ``cwd/`` with its temporary files under ``systmp/``."""
    ws = corpus.Workspace(tmp_path)
    yield ws
    ws.close()


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=pytest.mark.timeout(c.timeout)) for c in CASES])
def test_case(case, workspace, capfd, monkeypatch):
    before = corpus.snapshot()

    def run_mindpipe(argv: list[str], cwd: Path) -> tuple[int, str]:
        out = _in_process(argv, capfd)
        return out.code, out.stderr

    monkeypatch.chdir(workspace.tmp)
    corpus.prepare(case, workspace, run_mindpipe)
    monkeypatch.chdir(workspace.cwd)
    monkeypatch.setenv("TMPDIR", str(workspace.systmp))
    monkeypatch.setattr(tempfile, "tempdir", str(workspace.systmp))
    argv = workspace.argv(case)
    out = _child(argv, workspace, case.timeout) if case.subprocess else _in_process(argv, capfd)
    workspace.close()
    found = corpus.problems(case, out, workspace)
    if corpus.snapshot() != before:
        found.append("something was written outside the case's directory (inputs/ or the repository root)")
    assert not found, f"{case.id} ({case.cls}): " + "; ".join(found) + f"\nexit {out.code}\nstderr: {out.stderr[-3000:]}"


def test_corpus_covers_every_class_and_command():
    """Issue 15's acceptance: >= 150 cases, each class represented, every subcommand covered."""
    from mindpipe.cli import SUBCOMMANDS

    by_class = collections.Counter(c.cls for c in CASES)
    by_command = collections.Counter(c.command for c in CASES)
    assert len(CASES) >= 150
    assert set(by_class) == {"traceback", "silently-wrong", "unbounded", "files", "trust-process"}
    commands = {m.__name__.rsplit(".", 1)[-1].rstrip("_") for m in SUBCOMMANDS}
    assert commands == set(corpus.SUBCOMMANDS)
    assert commands <= set(by_command), commands - set(by_command)
    assert all(by_command[c] >= 10 for c in commands), by_command
    assert all(c.exit in (0, 2) for c in CASES)


def test_inputs_stay_small():
    """The committed inputs stay well under 1 MB (huge ones are made at run time)."""
    total = sum(p.stat().st_size for p in corpus.INPUTS.rglob("*") if p.is_file())
    assert total < 700_000, total
