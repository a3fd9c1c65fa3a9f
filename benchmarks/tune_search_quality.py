"""Search quality of the tuner: ``bo`` vs ``random`` against the exhaustive optimum (issue 6).

The space: gpt-13b on 64 A100-80GB (8 nodes × 8), global batch 128, the default space (the
what-if knobs at the executor's values: ``comm_priority=fair``, pinned here explicitly as before,
and ``overlap_grad_reduce=false``), ``balanced`` partitions — 6,666 valid plans. Step 1
simulates every one of them (a resumable ``grid`` sweep in one process; 188 s when last run) and
caches the results in ``benchmarks/results/tune_exhaustive_gpt-13b_a100x64.json``. The cache is
keyed by a hash of the simulator's, the traces' and the tuner's evaluation sources and by the
space itself, so it is recomputed whenever any of them changes (the simulated times move with the
performance model). Step 2 runs ``bo`` (budget 60) for seeds 0-9 with the cached results standing
in for the simulator — the simulator is deterministic, so a lookup returns exactly what a
simulation would — and counts the simulations it needs to reach a plan within 2 % of the
exhaustive optimum. ``random`` ignores what it is told, so its evaluation order is its seeded
permutation of the space; the simulations it needs are read off that order (the count a sweep
with ``--optimizer random`` and the same seed would report).

Run from the repository root (one command; step 1 is skipped when the cache is current)::

    .venv/bin/python benchmarks/tune_search_quality.py

Writes ``benchmarks/results/tune_search_quality.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.tuner.api import build_space, fingerprint
from mindpipe.tuner.keys import plan_of, point_key
from mindpipe.tuner.materialize import Problem
from mindpipe.tuner.objectives import Objective
from mindpipe.tuner.optimizers import RandomSearch
from mindpipe.tuner.records import EvaluationRecord, MemoryCode, Metrics, ScoredRecord, Status
from mindpipe.tuner.rules import Rule
from mindpipe.tuner.space import SearchSpace
from mindpipe.tuner.store import SweepStore
from mindpipe.tuner.sweep import SweepConfig, annotate, run_sweep

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
MODEL, CLUSTER, GLOBAL_BATCH, FIXES = "gpt-13b", "a100-sxm4-80gb:8x8", 128, ["comm_priority=fair"]
CACHE = RESULTS / "tune_exhaustive_gpt-13b_a100x64.json"
OUT = RESULTS / "tune_search_quality.json"
# Compact cache row: status, code, simulated, partition, then these metrics.
CACHED_METRICS = ("iteration_time_s", "throughput_samples_per_s", "throughput_tokens_per_s", "tflops_per_gpu", "mfu",
                  "bubble_fraction", "peak_memory_gib", "fits_in_memory", "energy_j", "carbon_gco2")
# What the simulated results depend on: the simulator, the contracts and hardware catalog, and
# the tuner's point → plan → evaluation path.
SOURCES = ("simulator", "traces", "tuner/keys.py", "tuner/space.py", "tuner/materialize.py", "tuner/partition.py",
           "tuner/evaluate.py")
_CODES = {Status.OUT_OF_MEMORY: MemoryCode, Status.INVALID: Rule}


def source_hash() -> str:
    """SHA-256 over the sources the simulated results depend on (``SOURCES``)."""
    h = hashlib.sha256()
    for entry in SOURCES:
        path = REPO / entry
        files = sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts) if path.is_dir() \
            else [path]
        for f in files:
            if f.suffix in (".py", ".json", ".csv"):
                h.update(str(f.relative_to(REPO)).encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


def make_space() -> SearchSpace:
    """The benchmark's search space."""
    return build_space(load_model(MODEL), load_cluster(CLUSTER), GLOBAL_BATCH, FIXES, ["balanced"])


def space_hash(space: SearchSpace) -> str:
    """Hash of the enumerated point keys (the cache must cover exactly these)."""
    return hashlib.sha256("\n".join(point_key(p) for p in space.points).encode()).hexdigest()[:16]


def exhaustive(space: SearchSpace, work: Path, workers: int, identity: dict[str, str]) -> dict[str, Any]:
    """Simulate every plan of the space (resumable through ``work``) and return the cache."""
    model, cluster = space.model, space.cluster
    problem = Problem(model, cluster, fingerprint=fingerprint(model, cluster, None))
    cfg = SweepConfig(optimizer="grid", budget=space.size, workers=workers, batch_size=4 * workers)
    store = SweepStore(work, {"benchmark": "search_quality", **identity}, resume=True)
    start = time.perf_counter()

    def progress(done: int, total: int, best: float | None) -> None:
        if done % 200 == 0:
            print(f"exhaustive: {done}/{total} simulated, {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)

    try:
        run_sweep(problem, space, Objective("throughput"), cfg, store, progress=progress)
    finally:
        store.close()
    rows = {}
    for key, rec in store.records.items():
        rows[key] = [rec.status.value, rec.code.value if rec.code is not None else None, rec.simulated,
                     rec.plan.partition if rec.plan is not None else None,
                     *[rec.metrics.get(k) for k in CACHED_METRICS]]
    return {"model": MODEL, "cluster": CLUSTER, "global_batch": GLOBAL_BATCH, "fixes": FIXES, "partitioner": "balanced",
            **identity, "space_size": space.size, "rejected_by_rule": space.describe()["rejected_by_rule"],
            "metrics": list(CACHED_METRICS), "wall_s": time.perf_counter() - start, "workers": workers, "rows": rows}


class CachedEvaluator:
    """Stands in for :func:`mindpipe.tuner.evaluate.evaluate` with the exhaustive results."""

    def __init__(self, cache: dict[str, Any]) -> None:
        self.rows = cache["rows"]
        self.metrics = cache["metrics"]

    def __call__(self, problem: Problem, point: dict[str, Any]) -> EvaluationRecord:
        key = point_key(point)
        status_s, code_s, simulated, partition, *values = self.rows[key]
        status = Status(status_s)
        code = _CODES[status](code_s) if status in _CODES else None
        metrics = Metrics(**{k: v for k, v in zip(self.metrics, values, strict=True) if v is not None})
        plan = plan_of(point, None, partition) if partition is not None else None
        return EvaluationRecord(key, dict(point), status, plan, code, simulated, metrics)


def evals_to_target(records: Iterable[ScoredRecord], target: float) -> int | None:
    """Simulations spent until the first feasible plan with value ≥ target (None if never)."""
    sims = 0
    for r in records:
        sims += r.simulated
        if r.feasible and r.value is not None and r.value >= target:
            return sims
    return None


def bo_search(space: SearchSpace, cache: dict[str, Any], seed: int, budget: int, surrogate: str,
              batch_size: int = 1) -> dict[str, Any]:
    """One seeded ``bo`` sweep over the cached space (the real sweep loop, a lookup for the simulator)."""
    problem = Problem(space.model, space.cluster)
    cfg = SweepConfig(optimizer="bo", budget=budget, seed=seed, surrogate=surrogate, workers=1, batch_size=batch_size)
    with tempfile.TemporaryDirectory() as tmp:
        store = SweepStore(tmp, {}, resume=False)
        start = time.perf_counter()
        res = run_sweep(problem, space, Objective("throughput"), cfg, store, evaluator=CachedEvaluator(cache), screen=None)
        store.close()
    return {"records": res.records, "best": res.best.value if res.best else None, "simulations": res.simulations,
            "search_s": time.perf_counter() - start}


def random_evals_to_target(space: SearchSpace, cache: dict[str, Any], seed: int, target: float) -> int | None:
    """Simulations ``--optimizer random --seed SEED`` spends before reaching ``target``."""
    evaluator, objective = CachedEvaluator(cache), Objective("throughput")
    order = RandomSearch(space.size, seed).ask(space.size)
    records = (annotate(evaluator(None, space.points[i]), objective) for i in order)  # type: ignore[arg-type]
    return evals_to_target(records, target)


def load_or_build_cache(space: SearchSpace, work: Path, workers: int) -> dict[str, Any]:
    """The cached exhaustive results when they match the current sources and space, else a new pass."""
    identity = {"source_hash": source_hash(), "space_hash": space_hash(space)}
    if CACHE.exists():
        cache = json.loads(CACHE.read_text())
        if all(cache.get(k) == v for k, v in identity.items()):
            return cache
        print(f"{CACHE.name} is stale (simulator, tuner or space changed): recomputing", file=sys.stderr)
    cache = exhaustive(space, work / identity["source_hash"], workers, identity)
    CACHE.write_text(json.dumps(cache, separators=(",", ":")) + "\n")
    return cache


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--budget", type=int, default=60, help="bo budget (simulations)")
    ap.add_argument("--surrogate", default="gp")
    ap.add_argument("--workers", type=int, default=1, help="processes for the exhaustive pass (default 1)")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "mindpipe_tune_exhaustive"),
                    help="resumable state of the exhaustive pass")
    ap.add_argument("--gap", type=float, default=0.02, help="target: within this fraction of the optimum")
    ap.add_argument("--batch-size", type=int, default=1,
                    help="bo proposals per round (the CLI's default is --workers, 2); results go to "
                         "tune_search_quality_batchN.json when N > 1")
    args = ap.parse_args(argv)
    out_path = OUT if args.batch_size == 1 else OUT.with_name(f"{OUT.stem}_batch{args.batch_size}.json")
    space = make_space()
    cache = load_or_build_cache(space, Path(args.work), args.workers)
    thr = cache["metrics"].index("throughput_samples_per_s") + 4
    feasible = [row[thr] for row in cache["rows"].values() if row[0] == "ok" and row[2]]
    optimum = max(feasible)
    target = optimum * (1 - args.gap)
    near = sum(1 for v in feasible if v >= target)
    table = []
    for seed in range(args.seeds):
        bo = bo_search(space, cache, seed, args.budget, args.surrogate, args.batch_size)
        row = {"seed": seed, "bo_evals_to_target": evals_to_target(bo["records"], target),
               "bo_best_gap": 1 - bo["best"] / optimum, "bo_search_s": round(bo["search_s"], 1),
               "random_evals_to_target": random_evals_to_target(space, cache, seed, target)}
        table.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    bo_n = [r["bo_evals_to_target"] for r in table]
    rnd_n = [r["random_evals_to_target"] for r in table]
    bo_med = statistics.median([n if n is not None else float("inf") for n in bo_n])
    rnd_med = statistics.median([n if n is not None else float("inf") for n in rnd_n])
    ratio = rnd_med / bo_med if bo_med else None
    out = {
        "command": ".venv/bin/python benchmarks/tune_search_quality.py"
                   + (f" --batch-size {args.batch_size}" if args.batch_size != 1 else ""),
        "space": {k: cache[k] for k in ("model", "cluster", "global_batch", "fixes", "partitioner", "space_size")},
        "source_hash": cache["source_hash"], "feasible_plans": len(feasible), "optimum_samples_per_s": optimum,
        "target_gap": args.gap, "plans_within_target": near, "bo_budget": args.budget, "surrogate": args.surrogate,
        "bo_batch_size": args.batch_size,
        "median_bo_evals_to_target": bo_med, "median_random_evals_to_target": rnd_med, "random_over_bo": ratio,
        "acceptance": {"bo_median_le_60": bo_med <= 60, "random_over_bo_ge_3": ratio is not None and ratio >= 3,
                       "feasible_ge_1000": len(feasible) >= 1000},
        "seeds": table, "exhaustive_wall_s": cache.get("wall_s"),
    }
    out_path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "seeds"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
