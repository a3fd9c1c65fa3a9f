"""Wall time of a default ``mindpipe tune`` sweep: this checkout against a baseline checkout (issue 14).

The sweep: ``mindpipe tune --model gpt-13b --cluster a100-sxm4-80gb:8x8 --budget 200 --out DIR
--json`` (default ``bo`` optimizer, default workers), run for the baseline checkout and for this one
back to back, with the same interpreter and settings, each in a fresh output directory. The baseline
is a checkout given by path (issue 14 measured against commit 067639e, whose packages are top-level
``simulator``, ``tuner`` …): it runs as ``PYTHONPATH=<checkout> <python> -m mindpipe.cli tune ...``
from inside it (a checkout whose sub-packages are folders mapped under ``mindpipe.*`` runs from a
tree of links to them, :func:`import_root`), so its own modules are imported, not this checkout's. ``--repeats N``
alternates the two (baseline first) N times.

This checkout's default space pins the what-if knobs to what the executor runs (``comm_priority``,
``overlap_grad_reduce``), so it is smaller than 067639e's, which searched ``comm_priority``.
``--current-arg=--what-if --current-arg=--fix --current-arg=overlap_grad_reduce=true`` makes this
checkout search exactly that older space (results to ``--out``; e.g.
``tune_sweep_speed_same_space.json``), to time the search machinery on equal terms.

Acceptance (issue 14): this checkout spends at most 60 % of the baseline's time. The machine's
load average before and after each run is recorded: on a shared machine, other work inflates both.

Run from the repository root::

    .venv/bin/python benchmarks/tune_sweep_speed.py --baseline /tmp/base

Writes ``benchmarks/results/tune_sweep_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results" / "tune_sweep_speed.json"
MODEL, CLUSTER, BUDGET = "gpt-13b", "a100-sxm4-80gb:8x8", 200


def git_commit(path: Path) -> str | None:
    """The checkout's commit (None when it is not a git checkout)."""
    res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True)
    return res.stdout.strip() or None if res.returncode == 0 else None


SUBPACKAGES = ("traces", "simulator", "tuner", "executor")


def import_root(checkout: Path, tmp: Path) -> Path:
    """A directory whose ``mindpipe`` package is the checkout's own code, for ``PYTHONPATH``.

    Since the packages moved under ``mindpipe.*`` (``pyproject.toml``'s ``package-dir``: folder
    ``tuner`` is ``mindpipe.tuner``), a checkout on ``PYTHONPATH`` provides only its ``mindpipe``
    folder, and the interpreter's editable install supplies every sub-package from *this*
    checkout — a baseline run would time this code. So the checkout's layout is rebuilt of
    symbolic links: ``mindpipe/*`` and ``mindpipe/<sub> → <checkout>/<sub>``. Older checkouts (top-level
    packages) are used as they are.
    """
    if not all((checkout / sub).is_dir() for sub in SUBPACKAGES) or (checkout / "mindpipe" / "tuner").exists():
        return checkout
    root = tmp / f"import-{abs(hash(str(checkout)))}"
    if not root.exists():
        pkg = root / "mindpipe"
        pkg.mkdir(parents=True)
        for entry in (checkout / "mindpipe").iterdir():
            (pkg / entry.name).symlink_to(entry)
        for sub in SUBPACKAGES:
            (pkg / sub).symlink_to(checkout / sub)
    return root


def run_sweep(checkout: Path, python: str, out: Path, budget: int, extra: list[str], model: str = MODEL,
              cluster: str = CLUSTER) -> dict[str, Any]:
    """One ``mindpipe tune`` run of ``checkout``: wall time, exit status and its summary."""
    cmd = [python, "-m", "mindpipe.cli", "tune", "--model", model, "--cluster", cluster, "--budget", str(budget),
           "--out", str(out), "--json", "--quiet", *extra]
    root = import_root(checkout, out.parent)
    # From inside ``root``: the working directory comes first on ``sys.path``, before PYTHONPATH.
    check = subprocess.run([python, "-c", "import mindpipe.tuner.sweep as m; print(m.__file__)"], cwd=root,
                           env=dict(os.environ, PYTHONPATH=str(root)), capture_output=True, text=True)
    if not Path(check.stdout.strip()).resolve().is_relative_to(checkout.resolve()):
        raise SystemExit(f"{checkout} would not run its own code (mindpipe.tuner from {check.stdout.strip()!r})")
    env = dict(os.environ, PYTHONPATH=str(root))
    load_before = os.getloadavg()
    start = time.perf_counter()
    res = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    out_info: dict[str, Any] = {"wall_s": round(wall, 1), "returncode": res.returncode,
                                "load_avg_before": [round(x, 2) for x in load_before],
                                "load_avg_after": [round(x, 2) for x in os.getloadavg()]}
    if res.returncode != 0:
        out_info["stderr_tail"] = res.stderr[-2000:]
        return out_info
    summary = json.loads(res.stdout)
    out_info.update({k: summary.get(k) for k in ("best_value", "evaluations", "evaluated_points", "space_size",
                                                  "infeasible_by_reason")})
    plan = summary.get("best_plan") or {}
    out_info["best_plan"] = {k: plan.get(k) for k in ("dp", "tp", "pp", "micro_batch_size", "schedule",
                                                        "virtual_stages", "recompute", "zero_stage", "comm_priority",
                                                        "overlap_grad_reduce")}
    return out_info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--baseline", required=True, help="path of the baseline checkout (e.g. a worktree of 067639e)")
    ap.add_argument("--python", default=sys.executable, help="interpreter for both runs (default: this one)")
    ap.add_argument("--budget", type=int, default=BUDGET)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--cluster", default=CLUSTER)
    ap.add_argument("--repeats", type=int, default=1, help="baseline/current pairs, alternating")
    ap.add_argument("--arg", action="append", default=[], help="extra argument for both runs (repeatable)")
    ap.add_argument("--current-arg", action="append", default=[],
                    help="extra argument for this checkout's run only (repeatable; write it --current-arg=VALUE)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    baseline = Path(args.baseline).resolve()
    checkouts = {"baseline": baseline, "current": REPO}
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "current": []}
    with tempfile.TemporaryDirectory(prefix="mindpipe-sweep-speed-") as tmp:
        for rep in range(args.repeats):
            for label in ("baseline", "current"):
                extra = args.arg + (args.current_arg if label == "current" else [])
                info = run_sweep(checkouts[label], args.python, Path(tmp) / f"{label}{rep}", args.budget, extra,
                                 args.model, args.cluster)
                runs[label].append(info)
                print(json.dumps({"run": label, "repeat": rep, **info}), file=sys.stderr, flush=True)
    ok = all(r["returncode"] == 0 for rs in runs.values() for r in rs)
    median = {label: statistics.median(r["wall_s"] for r in rs) for label, rs in runs.items()}
    ratio = median["current"] / median["baseline"] if ok else None
    result = {
        "command": ".venv/bin/python benchmarks/tune_sweep_speed.py --baseline " + str(args.baseline)
                   + (f" --repeats {args.repeats}" if args.repeats != 1 else "")
                   + (f" --budget {args.budget}" if args.budget != BUDGET else "")
                   + (f" --model {args.model}" if args.model != MODEL else "")
                   + (f" --cluster {args.cluster}" if args.cluster != CLUSTER else "")
                   + "".join(f" --arg={a}" for a in args.arg)
                   + "".join(f" --current-arg={a}" for a in args.current_arg)
                   + (f" --out {args.out}" if Path(args.out).resolve() != OUT else ""),
        "sweep": f"mindpipe tune --model {args.model} --cluster {args.cluster} --budget {args.budget} --out DIR --json --quiet"
                 + "".join(f" {a}" for a in args.arg),
        "current_only_args": args.current_arg,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "baseline": {"path": str(baseline), "commit": git_commit(baseline)},
        "current": {"path": str(REPO), "commit": git_commit(REPO)},
        "runs": runs, "median_wall_s": median, "current_over_baseline": ratio,
        "acceptance": {"current_le_60pct_of_baseline": ratio is not None and ratio <= 0.6},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: result[k] for k in ("median_wall_s", "current_over_baseline", "acceptance")}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
