"""Time and memory of every case of issue 15's hostile-input corpus (``tests/hostile/cases.toml``).

Run: ``.venv/bin/python benchmarks/hostile_corpus.py [--only REGEX] [--out FILE]``. Each case runs
as ``python -m mindpipe.cli ARGS`` in a child process, in its own temporary directory (its ``make``
steps first, untimed); the wall time and the peak resident memory (``os.wait4``'s ``ru_maxrss``:
the child's, or that of any descendant it waited for, whichever is larger) are measured, and the
outcome is checked by the corpus's own rules (:func:`corpus.problems`: exit status, one error
line, strict JSON, files). The target of issue 15: every case within 60 s and 2 GiB. Prints a
table and writes ``benchmarks/results/hostile_corpus.json`` with the slowest and the largest case,
the load average before and after (the machine may be shared) and every case's figures.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results" / "hostile_corpus.json"
MINDPIPE = [sys.executable, "-m", "mindpipe.cli"]
LIMIT_S = 60.0
LIMIT_MIB = 2048.0
KILL_AFTER_S = 180.0  # a hung case is killed (and reported) instead of stopping the benchmark

# tests/ is not a package: load the corpus module from its file (dataclasses need it in sys.modules).
_SPEC = importlib.util.spec_from_file_location("hostile_corpus", REPO / "tests" / "hostile" / "corpus.py")
assert _SPEC is not None and _SPEC.loader is not None
corpus = sys.modules[_SPEC.name] = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(corpus)


def _env(ws: corpus.Workspace) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(ws.systmp)}


def _prerequisite(argv: list[str], cwd: Path) -> tuple[int, str]:
    res = subprocess.run([*MINDPIPE, *argv], cwd=cwd, capture_output=True, text=True, timeout=600)
    return res.returncode, res.stderr


def measure(case: corpus.Case, ws: corpus.Workspace, logs: Path) -> tuple[corpus.Outcome, float, float]:
    """Run ``case`` in a child; return its outcome, wall seconds and peak RSS in MiB."""
    out_path, err_path = logs / "stdout", logs / "stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        start = time.perf_counter()
        child = subprocess.Popen([*MINDPIPE, *ws.argv(case)], cwd=ws.cwd, env=_env(ws), stdout=out, stderr=err,
                                 stdin=subprocess.DEVNULL)
        timer = threading.Timer(KILL_AFTER_S, lambda: child.send_signal(signal.SIGKILL))
        timer.start()
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        timer.cancel()
    child.returncode = os.waitstatus_to_exitcode(status)  # wait4 reaped it; keep Popen from waiting again
    outcome = corpus.Outcome(child.returncode, out_path.read_text(errors="replace"), err_path.read_text(errors="replace"))
    return outcome, wall, usage.ru_maxrss / 1024.0  # Linux: KiB


def run_case(case: corpus.Case, root: Path) -> dict[str, object]:
    """Prepare, measure and check one case; its row of the results."""
    base = root / case.id
    (base / "logs").mkdir(parents=True)
    ws = corpus.Workspace(base / "ws")
    ws.tmp.mkdir()
    try:
        corpus.prepare(case, ws, _prerequisite)
        outcome, wall, rss = measure(case, ws, base / "logs")
        ws.close()
        found = corpus.problems(case, outcome, ws)
    finally:
        ws.close()
        shutil.rmtree(base, ignore_errors=True)
    over = [f"took {wall:.1f} s (> {LIMIT_S:g} s)"] * (wall > LIMIT_S) + \
           [f"peak RSS {rss:.0f} MiB (> {LIMIT_MIB:g} MiB)"] * (rss > LIMIT_MIB)
    return {"id": case.id, "class": case.cls, "command": case.command, "exit": outcome.code,
            "wall_s": round(wall, 3), "max_rss_mib": round(rss, 1), "ok": not (found or over),
            "problems": found + over}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main(argv: list[str] | None = None) -> int:
    """Run the corpus (or the cases matching ``--only``), print the table, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", default=None, metavar="REGEX", help="run only the cases whose id matches")
    p.add_argument("--out", default=str(OUT), help=f"results JSON (default {OUT.relative_to(REPO)})")
    args = p.parse_args(argv)
    cases = [c for c in corpus.load_cases() if args.only is None or re.search(args.only, c.id)]
    load_before, before = _load(), corpus.snapshot()
    rows = []
    root = Path(tempfile.mkdtemp(prefix="hostile-corpus-"))
    try:
        for i, case in enumerate(cases, 1):
            row = run_case(case, root)
            rows.append(row)
            mark = "ok" if row["ok"] else "FAIL " + "; ".join(row["problems"])  # type: ignore[arg-type]
            print(f"{i:4d}/{len(cases)} {case.id:52s} exit {row['exit']:3d} {row['wall_s']:7.2f} s "
                  f"{row['max_rss_mib']:7.1f} MiB  {mark}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    outside = corpus.snapshot() != before
    slowest = max(rows, key=lambda r: r["wall_s"])  # type: ignore[arg-type, return-value]
    largest = max(rows, key=lambda r: r["max_rss_mib"])  # type: ignore[arg-type, return-value]
    failed = [r for r in rows if not r["ok"]]
    result = {
        "what": "every case of tests/hostile/cases.toml as `python -m mindpipe.cli ...` in a child process",
        "targets": {"wall_s": LIMIT_S, "max_rss_mib": LIMIT_MIB},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "load_avg_before": load_before, "load_avg_after": _load()},
        "cases": len(rows),
        "passed": len(rows) - len(failed),
        "by_class": dict(collections.Counter(str(r["class"]) for r in rows)),
        "by_command": dict(collections.Counter(str(r["command"]) for r in rows)),
        "slowest": {k: slowest[k] for k in ("id", "wall_s", "max_rss_mib")},
        "largest": {k: largest[k] for k in ("id", "wall_s", "max_rss_mib")},
        "total_wall_s": round(sum(float(r["wall_s"]) for r in rows), 1),  # type: ignore[arg-type]
        "wrote_outside_case_dirs": outside,
        "failed": [{"id": r["id"], "problems": r["problems"]} for r in failed],
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{len(rows)} cases, {len(failed)} failed; slowest {slowest['id']} {slowest['wall_s']} s; "
          f"largest {largest['id']} {largest['max_rss_mib']} MiB; wrote {args.out}")
    return 1 if failed or outside else 0


if __name__ == "__main__":
    sys.exit(main())
