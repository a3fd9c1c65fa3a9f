"""Every notebook in ``notebooks/`` executes top to bottom without a cell error (DESIGN.md layout).

The notebooks are found by globbing, so a new ``notebooks/*.ipynb`` is tested without touching
this file. Each runs in a fresh kernel whose working directory is a temporary folder (a notebook
must not write into the repository) and whose interpreter is *this* interpreter: the kernelspec
``python3`` is pinned to ``sys.executable`` in a private kernelspec directory, so a ``python3``
kernel installed elsewhere (user or system Jupyter paths) cannot run a notebook in another
environment.

A notebook that takes more than ~20 s on the 2-core CI machine says so in its metadata,
``{"mindpipe": {"slow": true}}``, and its test is then marked ``slow``. The kernel runs with
``MINDPIPE_NOTEBOOK_SMOKE=1``: a notebook that trains may then swap its model for a toy one (the
closed-loop notebook does: its cells are the same, its runs several times shorter).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = REPO / "notebooks"
KERNEL_NAME = "python3"
CELL_TIMEOUT_S = 600


def _is_slow(path: Path) -> bool:
    """True when the notebook's metadata declares it slow (``metadata.mindpipe.slow``)."""
    meta = nbformat.read(path, as_version=4).metadata.get("mindpipe", {})
    return bool(meta.get("slow", False))


def _notebook_params() -> list[Any]:
    """One parameter per ``notebooks/*.ipynb``, marked ``slow`` where the notebook says so."""
    return [
        pytest.param(p, id=p.name, marks=[pytest.mark.slow] if _is_slow(p) else [])
        for p in sorted(NOTEBOOK_DIR.glob("*.ipynb"))
    ]


def _kernel_spec_manager(root: Path) -> KernelSpecManager:
    """A kernelspec manager that knows only ``python3`` = this interpreter running ipykernel."""
    spec_dir = root / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python 3 ({sys.executable})",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    return KernelSpecManager(kernel_dirs=[str(root / "kernels")], ensure_native_kernel=False)


def _kernel_env(tmp: Path) -> dict[str, str]:
    """The kernel's environment: ours, with the repository importable even without an editable
    install, and ``tmp`` as its temporary directory (a notebook's own work folders, such as the
    closed loop's ``mkdtemp``, are then removed with the test's)."""
    env = dict(os.environ)
    tmp.mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["MINDPIPE_NOTEBOOK_SMOKE"] = "1"
    return env


def test_notebooks_are_found() -> None:
    """The glob sees the notebooks (guards against a silently empty parametrisation)."""
    assert list(NOTEBOOK_DIR.glob("*.ipynb")), f"no notebooks found under {NOTEBOOK_DIR}"


@pytest.mark.parametrize("path", _notebook_params())
def test_notebook_executes(path: Path, tmp_path: Path) -> None:
    """Run every cell in a fresh kernel; a cell error fails the test with that cell's traceback."""
    nb = nbformat.read(path, as_version=4)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    # An explicit connection file: without one jupyter_client makes it with tempfile.mkstemp in the system's
    # temporary directory, and one per test run was left there.
    km = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=_kernel_spec_manager(tmp_path / "jupyter"),
                       connection_file=str(tmp_path / "kernel-connection.json"))
    client = NotebookClient(
        nb,
        km=km,
        kernel_name=KERNEL_NAME,
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(workdir)}},
    )
    try:
        client.execute(env=_kernel_env(tmp_path / "tmp"))
    except CellExecutionError as e:
        pytest.fail(f"{path.name}: a cell raised\n{e}", pytrace=False)
