"""Dependencies point one way (DESIGN.md "Layout"), checked on the source of every package module.

An AST scan collects every ``import`` and ``from ... import`` at any depth — module level, inside
functions and classes, under ``if TYPE_CHECKING`` or ``try`` — of every module in the package
folders, and holds them to the rules:

* ``simulator/`` and ``tuner/`` never import torch (pure Python, fast to import, no GPU stack);
* ``executor/`` imports from ``mindpipe.simulator`` only the pure schedule modules (``schedules``,
  ``actions``, ``action_table``, ``subnet_schedules``) and nothing from ``mindpipe.tuner`` (measured means measured: no
  cost or memory model in the executor; the CLI injects what it needs);
* ``traces/`` (the data contracts) imports nothing from the simulator, the tuner or the executor.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("traces", "simulator", "tuner", "executor")
EXECUTOR_MAY_USE = ("mindpipe.simulator.schedules", "mindpipe.simulator.actions", "mindpipe.simulator.action_table",
                    "mindpipe.simulator.subnet_schedules")


@dataclass(frozen=True)
class Violation:
    """One import that breaks a rule: where, what, and which rule."""

    path: str
    line: int
    module: str
    rule: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: imports {self.module} ({self.rule})"


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``source``, at any depth.

    ``from M import a`` yields ``M.a`` (``a`` may be a submodule: ``from mindpipe.simulator import
    costs`` imports ``mindpipe.simulator.costs``). Relative imports are resolved against
    ``package``, the dotted package of the module being scanned.
    """
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return sorted(out, key=lambda item: item[0])  # ast.walk is breadth-first


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def rule_broken(folder: str, module: str) -> str | None:
    """The rule ``module`` breaks when imported from a module of ``folder`` (None: allowed)."""
    if folder in ("simulator", "tuner") and _within(module, "torch"):
        return f"{folder}/ never imports torch"
    if folder == "executor":
        if _within(module, "mindpipe.tuner"):
            return "executor/ imports nothing from the tuner"
        if _within(module, "mindpipe.simulator") and not any(_within(module, ok) for ok in EXECUTOR_MAY_USE):
            return "executor/ imports from the simulator only schedules, actions, action_table and subnet_schedules"
    if folder == "traces":
        for other in ("simulator", "tuner", "executor"):
            if _within(module, f"mindpipe.{other}"):
                return f"traces/ imports nothing from {other}/"
    return None


def scan(source: str, path: str, folder: str, package: str) -> list[Violation]:
    """Every rule-breaking import of one module's ``source``."""
    found = []
    for line, module in imported_modules(source, package):
        rule = rule_broken(folder, module)
        if rule is not None:
            found.append(Violation(path, line, module, rule))
    return found


def test_scanner_finds_imports_at_any_depth():
    source = '''
import os
from typing import TYPE_CHECKING
import torch.nn as nn
if TYPE_CHECKING:
    from mindpipe.simulator.costs import RooflineComputeModel
from mindpipe.simulator.schedules import build_schedule
from mindpipe.simulator import actions, memory

class Report:
    def run(self):
        try:
            from mindpipe.tuner.space import Space
        except ImportError:
            pass

def later():
    from . import report
    from ..simulator.timeline import write_chrome_trace
'''
    found = scan(source, "x.py", "executor", "mindpipe.executor")
    assert [(v.line, v.module) for v in found] == [
        (6, "mindpipe.simulator.costs.RooflineComputeModel"),
        (8, "mindpipe.simulator.memory"),
        (13, "mindpipe.tuner.space.Space"),
        (19, "mindpipe.simulator.timeline.write_chrome_trace"),
    ]
    assert [v.module for v in scan(source, "x.py", "simulator", "mindpipe.simulator")] == ["torch.nn"]
    assert [v.line for v in scan(source, "x.py", "traces", "mindpipe.traces")] == [6, 7, 8, 8, 13, 19]
    assert scan("import torchvision\nfrom torch_geometric import x\n", "y.py", "tuner", "mindpipe.tuner") == []


def _modules() -> list[tuple[str, Path]]:
    return [(folder, path) for folder in PACKAGES for path in sorted((REPO / folder).rglob("*.py"))]


def test_the_package_folders_exist_and_hold_modules():
    counts = {folder: sum(1 for f, _ in _modules() if f == folder) for folder in PACKAGES}
    assert all(n >= 3 for n in counts.values()), counts


@pytest.mark.parametrize("folder", PACKAGES)
def test_dependencies_point_one_way(folder):
    found = []
    for f, path in _modules():
        if f != folder:
            continue
        rel = path.relative_to(REPO)
        package = "mindpipe." + ".".join(rel.parent.parts)
        found += scan(path.read_text(encoding="utf-8"), str(rel), folder, package)
    assert not found, "\n".join(map(str, found))


def test_the_launcher_does_not_import_torch():
    """``mindpipe run`` checks the plan and starts torchrun, whose ranks import torch: an import of
    torch in the launcher itself added ~3 s to every run before its ranks started."""
    import subprocess
    import sys

    code = ("import sys, mindpipe.cli, mindpipe.cli.run, mindpipe.executor.launch, mindpipe.executor.watchdog; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False", out.stderr
