"""Sweeps end to end: the CLI's outputs, what-if knobs, resuming a killed sweep, Dask, and "no feasible plan"."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from mindpipe.traces.builtin import load_cluster, load_model, load_plan
from mindpipe.traces.errors import ContractError
from mindpipe.tuner.api import build_space, tune
from mindpipe.tuner.evaluate import evaluate
from mindpipe.tuner.keys import SEARCHED_WHAT_IF_KEYS, point_key, what_if_used
from mindpipe.tuner.materialize import Problem
from mindpipe.tuner.objectives import Objective, parse_constraint
from mindpipe.tuner.optimizers import RandomSearch
from mindpipe.tuner.records import EvaluationRecord, Status
from mindpipe.tuner.store import CONFIG_NAME, RECORDS_NAME
from mindpipe.tuner.sweep import SweepConfig

from mindpipe.cli import main as mindpipe_main

REPO = Path(__file__).resolve().parents[2]
# A model that simulates in a few tens of milliseconds per plan on 8 A100s.
SMALL = ('{"kind":"gpt","num_layers":8,"hidden_size":1024,"num_heads":16,"seq_len":512,"vocab_size":32000,'
         '"name":"gpt-small"}')
CLUSTER = "a100-sxm4-80gb:1x8"
# 72 points: every mesh and micro-batch size, two recompute settings.
NARROW = ["--fix", "schedule=1f1b", "--fix", "recompute=none,full", "--fix", "zero_stage=0",
          "--fix", "comm_priority=fair", "--fix", "sequence_parallel=false"]
NARROW_FIXES = [a for a in NARROW if a != "--fix"]


def _png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def grid_sweep(tmp_path_factory):
    """One grid sweep through the CLI (in process), shared by the output checks: (dir, code, stdout, stderr)."""
    out = tmp_path_factory.mktemp("grid") / "sweep"
    argv = ["tune", "--model", SMALL, "--cluster", CLUSTER, "--global-batch", "32", *NARROW, "--optimizer", "grid",
            "--budget", "200", "--workers", "1", "--out", str(out), "--json"]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = mindpipe_main(argv)
    return out, code, stdout.getvalue(), stderr.getvalue()


def test_cli_grid_sweep_writes_every_output(grid_sweep, capsys):
    out, code, stdout, stderr = grid_sweep
    assert code == 0, stderr
    summary = json.loads(stdout)  # one JSON object, nothing else on stdout
    assert "simulations" in stderr  # the progress bar goes to stderr
    for key in ("best_plan", "best_value", "evaluations", "infeasible"):
        assert key in summary
    space = build_space(load_model(SMALL), load_cluster(CLUSTER), 32, NARROW_FIXES, ["balanced"])
    # grid evaluates the whole space
    assert summary["evaluated_points"] == summary["space_size"] == space.size >= 20

    csv = pd.read_csv(out / "evaluations.csv")
    parquet = pd.read_parquet(out / "evaluations.parquet")
    assert len(csv) == len(parquet) == space.size
    assert list(csv.columns) == list(parquet.columns)
    assert int(csv["simulated"].sum()) == summary["evaluations"]
    # infeasible: evaluated and out of memory (or over a constraint) + filtered by the rules
    assert int((~csv["feasible"]).sum()) + space.rejected_total == summary["infeasible"]
    assert summary["infeasible_by_reason"].get("rules", 0) == space.rejected_total
    feasible = csv[csv["feasible"]]
    assert summary["best_value"] == pytest.approx(feasible["value"].max())

    # The best plan is a Plan document with its partition and what it was made for; simulating it
    # reproduces the value.
    plan = load_plan(str(out / "best_plan.json"))
    assert plan.partition is not None and sum(plan.partition) == 8 and len(plan.partition) == plan.num_stages
    assert json.loads((out / "best_plan.json").read_text()) == summary["best_plan"]
    assert plan.made_for is not None and plan.made_for.tool == "mindpipe tune"
    assert plan.made_for.model == load_model(SMALL) and plan.made_for.cluster == load_cluster(CLUSTER)
    assert plan.made_for.trace is None and plan.made_for.calibration is None and plan.made_for.what_if == []
    assert csv["what_if"].isna().all()  # the default space: no plan uses a what-if knob
    assert summary["what_if"] == {"searched": [], "pinned": {}, "best_plan_uses": []}
    assert summary["flash_attention_searched"] == [False]  # explicit attention unless pinned (said in the output)
    assert mindpipe_main(["simulate", "--model", SMALL, "--cluster", CLUSTER, "--plan", str(out / "best_plan.json"),
                          "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["throughput_samples_per_s"] == pytest.approx(summary["best_value"], rel=1e-9)

    # Pareto front: nothing feasible dominates a front row, and the fastest plan is on it.
    front = pd.read_csv(out / "pareto.csv")
    assert summary["pareto_points"] == len(front) >= 1
    for _, r in front.iterrows():
        dominated = feasible[(feasible["throughput_samples_per_s"] >= r["throughput_samples_per_s"])
                             & (feasible["carbon_per_sample_g"] <= r["carbon_per_sample_g"])
                             & ((feasible["throughput_samples_per_s"] > r["throughput_samples_per_s"])
                                | (feasible["carbon_per_sample_g"] < r["carbon_per_sample_g"]))]
        assert dominated.empty
    assert front["throughput_samples_per_s"].max() == pytest.approx(feasible["throughput_samples_per_s"].max())
    assert _png(out / "convergence.png") and _png(out / "pareto.png")


@pytest.mark.parametrize("case", ["max-throughput-under-memory", "min-carbon-over-throughput"])
def test_constrained_objective_respects_the_bound(grid_sweep, tmp_path, case):
    """Constrained forms: the answer is the best plan of the grid's table that meets the bound."""
    out, code, _, stderr = grid_sweep
    assert code == 0, stderr
    table = pd.read_csv(out / "evaluations.csv")
    feasible = table[table["feasible"]]
    fastest = feasible.loc[feasible["throughput_samples_per_s"].idxmax()]
    if case == "max-throughput-under-memory":
        bound = 0.99 * float(fastest["peak_memory_gib"])  # excludes the unconstrained optimum
        objective = Objective("throughput", constraints=[parse_constraint(f"peak_memory<={bound!r}")])
        allowed = feasible[feasible["peak_memory_gib"] <= bound]
        expected = allowed["throughput_samples_per_s"].max()
    else:
        bound = float(feasible["throughput_samples_per_s"].median())
        objective = Objective("carbon", constraints=[parse_constraint(f"throughput>={bound!r}")])
        allowed = feasible[feasible["throughput_samples_per_s"] >= bound]
        expected = allowed["carbon_per_sample_g"].min()
    assert 0 < len(allowed) < len(feasible)
    info = tune(SMALL, CLUSTER, out=tmp_path / "c", global_batch=32, fixes=NARROW_FIXES, objective=objective,
                config=SweepConfig(optimizer="grid", budget=200, workers=1), plots=False).summary.to_dict()
    assert info["best_value"] == pytest.approx(expected, rel=1e-12)
    assert info["infeasible_by_reason"]["constraint"] == len(feasible) - len(allowed)


class _Counting:
    """Evaluator that records which points it was asked to evaluate."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def __call__(self, problem, point):
        self.keys.append(point_key(point))
        return evaluate(problem, point)


def _read_keys(path: Path) -> list[str]:
    keys = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a torn last line
            keys.append(json.loads(line)["key"])
    return keys


def test_killed_sweep_resumes_without_re_evaluating(tmp_path):
    out = tmp_path / "sweep"
    budget, seed = 100, 3
    # A wider space than NARROW (~200 points), so the kill lands long before the budget.
    wide = ["--fix", "schedule=1f1b", "--fix", "zero_stage=0", "--fix", "comm_priority=fair"]
    fixes = [a for a in wide if a != "--fix"]
    args = ["--model", SMALL, "--cluster", CLUSTER, "--global-batch", "32", *wide, "--optimizer", "random",
            "--seed", str(seed), "--budget", str(budget), "--workers", "1", "--no-plots", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "mindpipe.cli", "tune", *args, "--quiet"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    records = out / RECORDS_NAME
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if records.exists() and len(_read_keys(records)) >= 3:
                break
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)  # mid-sweep, as a crash or a preempted node would
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""
    before = _read_keys(records)
    assert 3 <= len(before) < budget
    with records.open("a") as fh:  # a line torn by the kill is ignored on load
        fh.write('{"key": "[8,1,1,')

    # Without --resume the directory is refused; with other search settings it cannot resume (what to
    # change is named as the caller names it: tune()'s config field here).
    assert mindpipe_main(["tune", *args, "--quiet"]) == 2
    with pytest.raises(ContractError, match=r"differs in seed \(config\.seed\); cannot resume"):
        tune(SMALL, CLUSTER, out=out, global_batch=32, fixes=fixes, resume=True, plots=False,
             config=SweepConfig(optimizer="random", seed=seed + 1, budget=budget, workers=1))
    with pytest.raises(ContractError, match=r"problem \(model, cluster, trace or calibration\)"):
        tune(SMALL, "a100-sxm4-80gb:1x4", out=out, global_batch=32, fixes=fixes, resume=True, plots=False,
             config=SweepConfig(optimizer="random", seed=seed, budget=budget, workers=1))

    counting = _Counting()
    outcome = tune(SMALL, CLUSTER, out=out, global_batch=32, fixes=fixes, resume=True, plots=False,
                   config=SweepConfig(optimizer="random", seed=seed, budget=budget, workers=1), evaluator=counting)
    assert not set(counting.keys) & set(before)  # nothing stored was evaluated again
    assert outcome.result.reused == len(before)
    keys = [r.key for r in outcome.result.records]
    assert len(set(keys)) == len(keys) and keys[:len(before)] == before
    assert sorted(counting.keys) == sorted(keys[len(before):])
    # The resumed sweep is the uninterrupted one: the seeded random order, to the budget.
    order = RandomSearch(outcome.space.size, seed).ask(len(keys))
    assert keys == [point_key(outcome.space.points[i]) for i in order]
    assert outcome.result.simulations == budget
    assert _read_keys(records) == keys  # the store holds each evaluation once, torn line gone


class _Interrupt(Exception):
    pass


class _DiesAfter:
    """Evaluator that is "killed" (raises) when asked for its (n+1)-th evaluation."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, problem, point):
        if self.n == 0:
            raise _Interrupt
        self.n -= 1
        return evaluate(problem, point)


def test_interrupted_bo_sweep_resumes_into_the_uninterrupted_search(tmp_path):
    """BO's proposals depend on what it was told: a resumed sweep must replay them exactly."""
    kwargs: dict[str, Any] = dict(global_batch=32, fixes=NARROW_FIXES, plots=False,
                  config=SweepConfig(optimizer="bo", seed=5, budget=10, n_initial=4, workers=1))
    whole = tune(SMALL, CLUSTER, out=tmp_path / "whole", **kwargs)
    with pytest.raises(_Interrupt):
        tune(SMALL, CLUSTER, out=tmp_path / "cut", evaluator=_DiesAfter(6), **kwargs)
    assert len(_read_keys(tmp_path / "cut" / RECORDS_NAME)) == 6
    other_batch = dict(kwargs, config=SweepConfig(optimizer="bo", seed=5, budget=10, n_initial=4, workers=1,
                                                  batch_size=2))
    with pytest.raises(ContractError, match="batch_size"):  # another batching would be another search
        tune(SMALL, CLUSTER, out=tmp_path / "cut", resume=True, **other_batch)
    counting = _Counting()
    resumed = tune(SMALL, CLUSTER, out=tmp_path / "cut", resume=True, evaluator=counting, **kwargs)
    keys = [r.key for r in resumed.result.records]
    assert keys == [r.key for r in whole.result.records]
    assert counting.keys == keys[6:] and resumed.result.reused == 6
    assert resumed.summary.best_plan == whole.summary.best_plan


def _on_worker(problem, point):
    """Evaluate and note which Dask worker ran it."""
    from distributed import get_worker

    rec = evaluate(problem, point)
    rec.message = get_worker().address
    return rec


def test_dask_local_cluster_sweep_matches_local(tmp_path):
    distributed = pytest.importorskip("distributed")
    cfg: dict[str, Any] = dict(optimizer="random", seed=1, budget=6, workers=1)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as lc:
        worker = next(iter(lc.workers.values())).address
        remote = tune(SMALL, CLUSTER, out=tmp_path / "dask", global_batch=32, fixes=NARROW_FIXES, plots=False,
                      config=SweepConfig(**cfg, dask=lc.scheduler_address), evaluator=_on_worker)
    local = tune(SMALL, CLUSTER, out=tmp_path / "local", global_batch=32, fixes=NARROW_FIXES, plots=False,
                 config=SweepConfig(**cfg))
    assert {r.message for r in remote.result.records} == {worker}  # every evaluation ran on the Dask worker
    assert [r.key for r in remote.result.records] == [r.key for r in local.result.records]
    assert [r.value for r in remote.result.records] == [r.value for r in local.result.records]
    assert remote.summary.best_plan == local.summary.best_plan


def test_local_process_pool_sweep_matches_inline(tmp_path):
    """The default executor (spawned local processes) returns what one in-process worker does."""
    cfg: dict[str, Any] = dict(optimizer="random", seed=2, budget=6)
    pooled = tune(SMALL, CLUSTER, out=tmp_path / "pool", global_batch=32, fixes=NARROW_FIXES, plots=False,
                  config=SweepConfig(**cfg, workers=2))
    inline = tune(SMALL, CLUSTER, out=tmp_path / "inline", global_batch=32, fixes=NARROW_FIXES, plots=False,
                  config=SweepConfig(**cfg, workers=1))
    assert [r.key for r in pooled.result.records] == [r.key for r in inline.result.records]
    assert [r.value for r in pooled.result.records] == [r.value for r in inline.result.records]
    assert pooled.summary.evaluations == inline.summary.evaluations == 6


def test_unreachable_dask_scheduler_is_a_clear_error(tmp_path):
    pytest.importorskip("distributed")
    with pytest.raises(ContractError, match="cannot reach the Dask scheduler"):
        tune(SMALL, CLUSTER, out=tmp_path / "x", global_batch=32, fixes=NARROW_FIXES, plots=False,
             config=SweepConfig(optimizer="random", budget=2, workers=1, dask="tcp://127.0.0.1:9", dask_timeout_s=2))


def test_no_plan_passes_the_rules_exit_2(tmp_path):
    res = subprocess.run([sys.executable, "-m", "mindpipe.cli", "tune", "--model", SMALL, "--cluster", CLUSTER,
                          "--fix", "tp=3", "--out", str(tmp_path / "o"), "--json"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 2
    assert res.stdout == ""
    assert "no feasible plan" in res.stderr and "tp" in res.stderr and "Relax --fix" in res.stderr
    assert "Traceback" not in res.stderr
    # The device count is said, and a rule's count is of combinations (not a device count in parentheses).
    assert "no feasible plan on 8 devices: the one combination of the search space breaks a rule" in res.stderr
    assert "×)" not in res.stderr


def test_no_plan_fits_in_memory_exit_2(tmp_path, capsys):
    out = tmp_path / "o"
    # 175B parameters on 8 GPUs cannot hold their model states: every plan is out of memory.
    code = mindpipe_main(["tune", "--model", "gpt3-175b", "--cluster", CLUSTER, "--global-batch", "64",
                          "--fix", "tp=8", "--fix", "schedule=1f1b", "--fix", "zero_stage=0,3", "--optimizer", "bo",
                          "--budget", "10", "--workers", "1", "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert "no feasible plan among the" in captured.err and "out_of_memory" in captured.err
    table = pd.read_csv(out / "evaluations.csv")  # what was tried is still written, and counted
    assert len(table) > 0 and (table["status"] == "out_of_memory").all() and not table["simulated"].any()
    assert not (out / "best_plan.json").exists()


def _always_fails(problem: Any, point: Any) -> EvaluationRecord:
    """An evaluator whose simulator is broken: every evaluation ends in an error record."""
    return EvaluationRecord(point_key(point), dict(point), Status.ERROR, message="RuntimeError: simulator bug")


def test_failing_evaluations_count_against_the_budget(tmp_path):
    """A systematic simulator error stops the sweep at its budget instead of running the whole space."""
    from mindpipe.tuner.api import NoFeasiblePlan

    with pytest.raises(NoFeasiblePlan, match="error: 7"):
        tune(SMALL, CLUSTER, out=tmp_path / "t", global_batch=32, plots=False,
             config=SweepConfig(optimizer="random", budget=7, workers=1), evaluator=_always_fails)


def test_what_if_sweep_marks_every_output(tmp_path, capsys):
    """--what-if searches the knobs the executor does not run, and every output says which plan uses one."""
    out = tmp_path / "w"
    fixes = ["--fix", "schedule=1f1b", "--fix", "recompute=none", "--fix", "zero_stage=0",
             "--fix", "sequence_parallel=false", "--fix", "micro_batch_size=1,4"]
    argv = ["tune", "--model", SMALL, "--cluster", CLUSTER, "--global-batch", "32", *fixes, "--optimizer", "grid",
            "--budget", "400", "--workers", "1", "--no-plots", "--quiet", "--out", str(out)]
    # Pinning a knob off the executor's value needs --what-if: one line, exit 2.
    assert mindpipe_main([*argv, "--fix", "comm_priority=pp_first"]) == 2
    err = capsys.readouterr().err
    assert "comm_priority" in err and "--what-if" in err and len(err.strip().splitlines()) == 1
    assert mindpipe_main([*argv, "--what-if"]) == 0
    printed = capsys.readouterr().out
    assert "what-if knobs    searched comm_priority, overlap_grad_reduce" in printed

    csv = pd.read_csv(out / "evaluations.csv", keep_default_na=False)
    for _, row in csv.iterrows():
        expected = [k for k, run in SEARCHED_WHAT_IF_KEYS.items() if str(row[k]).lower() != str(run).lower()]
        assert row["what_if"] == ",".join(expected)
    assert set(csv["what_if"]) >= {"", "comm_priority", "overlap_grad_reduce", "comm_priority,overlap_grad_reduce"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["what_if"]["searched"] == list(SEARCHED_WHAT_IF_KEYS)
    plan = load_plan(str(out / "best_plan.json"))
    assert plan.made_for is not None and plan.made_for.what_if == what_if_used(plan)
    assert summary["what_if"]["best_plan_uses"] == plan.made_for.what_if
    assert summary["what_if"]["pinned"] == {}
    # A knob named and pinned is said to be pinned, not searched.
    pinned = tmp_path / "p"
    argv[argv.index("--out") + 1] = str(pinned)
    assert mindpipe_main([*argv, "--what-if", "blocking_p2p,comm_priority", "--fix", "blocking_p2p=true"]) == 0
    assert "what-if knobs    searched comm_priority; pinned blocking_p2p=true; " in capsys.readouterr().out
    summary = json.loads((pinned / "summary.json").read_text())
    assert summary["what_if"]["searched"] == ["comm_priority"]
    assert summary["what_if"]["pinned"] == {"blocking_p2p": True}


def test_trace_and_calibration_are_named_in_made_for(tmp_path):
    from mindpipe.traces.data import load_shipped_trace

    trace = load_shipped_trace("gpt-mini.cpu")
    outcome = tune("gpt-mini", "cpu:1x4", out=tmp_path / "t", global_batch=8, fixes=["schedule=1f1b"],
                   trace=trace, trace_source="gpt-mini.cpu", plots=False,
                   config=SweepConfig(optimizer="random", budget=4, workers=1))
    made_for = load_plan(str(tmp_path / "t" / "best_plan.json")).made_for
    assert made_for is not None and made_for.model == load_model("gpt-mini")
    assert made_for.trace is not None and made_for.trace.startswith("gpt-mini.cpu sha256:")
    assert made_for.calibration is None
    assert outcome.summary.to_dict()["best_plan"]["made_for"]["trace"] == made_for.trace


def test_a_store_of_another_version_is_refused_in_one_line(tmp_path):
    out = tmp_path / "old"
    out.mkdir()
    (out / CONFIG_NAME).write_text(json.dumps({"state_version": 1, "problem": "x"}))
    (out / RECORDS_NAME).write_text('{"key": "[1]", "status": "ok", "metrics": {}}\n')
    with pytest.raises(ContractError, match="state_version=1") as e:
        tune(SMALL, CLUSTER, out=out, global_batch=32, fixes=NARROW_FIXES, resume=True, plots=False,
             config=SweepConfig(optimizer="random", budget=2, workers=1))
    assert "\n" not in str(e.value) and str(e.value).endswith("start the sweep again in a new out")


def test_store_round_trips_typed_records(tmp_path):
    """What the store writes is what a resumed sweep reads back: status, code, plan and metrics."""
    from mindpipe.tuner.store import SweepStore

    space = build_space(load_model("gpt3-175b"), load_cluster(CLUSTER), 64, ["tp=8", "schedule=1f1b"], ["balanced"])
    problem = Problem(space.model, space.cluster)
    recs = [evaluate(problem, p) for p in space.points[:3]]
    assert {r.status for r in recs} == {Status.OUT_OF_MEMORY}
    store = SweepStore(tmp_path, {"x": 1}, resume=False)
    for r in recs:
        store.add(r)
    store.close()
    again = SweepStore(tmp_path, {"x": 1}, resume=True)
    again.close()
    assert [again.get(r.key) for r in recs] == recs


def test_cli_text_lists_the_files_written_and_words_counts_of_one(tmp_path, capsys):
    """--no-plots: no PNG listed; one rule-filtered combination, one front plan in the singular."""
    out = tmp_path / "t"
    argv = ["tune", "--model", SMALL, "--cluster", "a100-sxm4-80gb:1x2", "--global-batch", "8", *NARROW,
            "--fix", "micro_batch_size=8", "--fix", "dp=1", "--fix", "tp=1,2",
            "--fix", "pp=1,2", "--optimizer", "grid", "--budget", "10", "--workers", "1", "--no-plots", "--quiet",
            "--out", str(out)]
    assert mindpipe_main(argv) == 0
    lines = {line[:16].strip(): line[17:] for line in capsys.readouterr().out.splitlines()}
    assert lines["outputs"] == f"{out}/best_plan.json, best.json, evaluations.csv/.parquet, pareto.csv, summary.json"
    state = {"sweep.json", "evaluations.jsonl"}  # the sweep's own state, for --resume
    assert {p.name for p in out.iterdir()} == state | {"best_plan.json", "best.json", "evaluations.csv",
                                                       "evaluations.parquet", "pareto.csv", "summary.json"}
    assert not list(out.glob("*.png"))
    assert lines["pareto front"].startswith("1 plan (")


def test_a_notebook_shows_results_in_kilobytes_not_megabytes(tmp_path):
    # The cell that ends with tune()'s outcome or a timeline result printed every point of the space
    # (3.7 MB for gpt-13b on 64 GPUs) or every timeline event (1.2 MB for gpt3-175b pp16).
    from mindpipe.simulator.api import SimulationOptions, simulate
    from mindpipe.traces.builtin import load_cluster, load_model
    from mindpipe.traces.config import Plan
    from mindpipe.tuner.api import tune
    from mindpipe.tuner.sweep import SweepConfig

    oc = tune("gpt-13b", "a100-sxm4-80gb:8x8", out=tmp_path / "t", plots=False,
              config=SweepConfig(optimizer="random", budget=2, workers=1))
    assert len(oc.space.points) > 1000 and len(repr(oc)) < 20_000
    r = simulate(load_model("gpt3-175b"), load_cluster("a100-sxm4-80gb:64x8"),
                 Plan(tp=8, pp=16, dp=4, micro_batch_size=1, global_batch_size=512), SimulationOptions(timeline=True))
    assert r.timeline is not None and len(r.timeline) > 1000 and len(repr(r)) < 20_000


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signalled_sweep_stops_its_workers_says_one_line_and_resumes(tmp_path, sig):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) or SIGTERM to a sweep with
    worker processes: one line, exit 128 + the signal, no worker left running and no worker's
    traceback; what was evaluated is kept for --resume."""
    out = tmp_path / "t"
    argv = [sys.executable, "-m", "mindpipe.cli", "tune", "--model", "gpt-mini", "--cluster", "cpu:1x4",
            "--budget", "2000", "--workers", "2", "--optimizer", "random", "--no-plots", "--out", str(out)]

    def own_group() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # as a shell's foreground job has it
        os.setsid()

    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=own_group)
    jsonl = out / "evaluations.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and \
            (not jsonl.exists() or len(jsonl.read_text().splitlines()) < 4):
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    signum = getattr(signal, sig)
    if sig == "SIGINT":
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err[-2000:]
    assert "Traceback" not in err and err.splitlines()[-1] == \
        ("mindpipe: interrupted" if sig == "SIGINT" else "mindpipe: stopped by SIGTERM")
    time.sleep(0.5)
    left = subprocess.run(["ps", "-o", "pid=,stat=", "-g", str(proc.pid)], capture_output=True, text=True).stdout
    assert [ln for ln in left.splitlines() if "Z" not in ln.split()[-1]] == [], left  # zombies hold nothing
    again = subprocess.run([*argv, "--resume", "--budget", "20", "--quiet"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    reused = re.search(r"simulations +\d+ \(\d+ points considered, (\d+) from a previous run\)", again.stdout)
    assert reused is not None and int(reused.group(1)) >= 3, again.stdout


def test_the_pareto_plot_says_what_was_tuned_and_when_its_front_is_one_plan(monkeypatch, tmp_path):
    from mindpipe.tuner import output

    drawn = {}
    monkeypatch.setattr(output, "_save", lambda fig, path: drawn.update(ax=fig.axes[0]))
    rows = [{"feasible": True, "carbon_per_sample_g": 1e-5, "throughput_samples_per_s": 30.0},
            {"feasible": True, "carbon_per_sample_g": 2e-5, "throughput_samples_per_s": 20.0}]
    output._plot_pareto(rows, rows[:1], tmp_path / "p.png", "gpt-mini on cpu:1x2 (2 devices)")
    assert drawn["ax"].get_title() == "Pareto front: gpt-mini on cpu:1x2 (2 devices) — one plan: the fastest is also " \
                                      "the cleanest"


def test_a_pool_worker_ignores_ctrl_c_from_its_start():
    """The terminal's Ctrl-C reaches every process of the group: a worker still importing in
    ``spawn_main``, before the pool's initializer ran, printed a KeyboardInterrupt traceback (seen in
    CI). Spawned through the sweep's context, it ignores SIGINT from its first instruction."""
    import concurrent.futures as cf

    from mindpipe.tuner.sweep import _SpawnContext

    before = signal.getsignal(signal.SIGINT)  # an xdist worker ignores SIGINT itself
    with cf.ProcessPoolExecutor(1, mp_context=_SpawnContext()) as pool:
        assert pool.submit(signal.getsignal, signal.SIGINT).result(timeout=120) == signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) == before  # the sweep's own handler is back


def test_an_interrupted_pool_is_gone_before_the_sweep_returns():
    """A stopped sweep ends its workers and waits for the pool's manager thread, which closes the
    wake-up pipe Python writes to at exit: on 3.11 a thread still closing it then raced that write
    ("Bad file descriptor" in threading's shutdown, after the one-line stop message)."""
    import concurrent.futures as cf

    from mindpipe.tuner.sweep import _SpawnContext, _stop_pool

    pool = cf.ProcessPoolExecutor(2, mp_context=_SpawnContext())
    running = pool.submit(time.sleep, 60)
    pool.submit(time.sleep, 60)
    while not running.running():
        time.sleep(0.05)
    manager, workers = pool._executor_manager_thread, list(pool._processes.values())
    assert manager is not None and manager.is_alive()
    _stop_pool(pool, abort=True)
    assert not manager.is_alive()
    assert all(w.exitcode is not None for w in workers)
