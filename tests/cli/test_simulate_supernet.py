"""``mindpipe simulate`` with a supernet: the summary, one JSON object, exit 2 on bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CSP = '{"pp":2,"subnet_schedule":"csp"}'


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mindpipe.cli", "simulate", *args], capture_output=True, text=True,
                          timeout=300)


def test_json_is_one_object_with_the_keys():
    res = run("--model", "supernet-mini", "--cluster", "cpu:1x2", "--plan", CSP, "--subnets", "60", "--json")
    assert res.returncode == 0, res.stderr
    payload = json.loads(res.stdout)
    for key in ("subnets_per_hour", "total_time_s", "bubble_fraction", "stages", "memory_by_stage_gib",
                "peak_memory_gib", "fits_in_memory", "schedule", "window", "num_subnets", "cost_source"):
        assert key in payload
    assert payload["num_subnets"] == 60 and payload["schedule"] == "csp" and payload["window"] == 4
    stage = payload["stages"][0]
    for key in ("busy_fraction", "conflict_stall_s", "other_idle_s", "conflict_rate", "conflict_rate_closed_form"):
        assert key in stage
    assert stage["memory"]["context_switching"] is True
    assert payload["subnets_per_hour"] == pytest.approx(3600 * 60 / payload["total_time_s"])


def test_json_is_deterministic():
    args = ("--model", "supernet-mini", "--cluster", "cpu:1x2", "--plan", CSP, "--subnets", "40", "--json")
    assert run(*args).stdout == run(*args).stdout


def test_summary():
    res = run("--model", "supernet-mini", "--cluster", "cpu:1x2", "--plan", '{"pp":2,"subnet_schedule":"sequential"}',
              "--subnets", "20", "--no-context-switch")
    assert res.returncode == 0, res.stderr
    assert "subnets/hour" in res.stdout and "conflict stall" in res.stdout and "context switching off" in res.stdout


@pytest.mark.parametrize("extra,needle", [
    (("--plan", '{"pp":2,"tp":2}'), "tp=2"),
    (("--plan", '{"pp":2,"subnet_schedule":"pipedream"}'), "subnet_schedule"),
    (("--plan", CSP, "--subnets", "0"), "argument --subnets: '0' is not a whole number"),
    (("--plan", CSP, "--timeline", "t.json"), "--timeline"),
    (("--plan", CSP, "--memory-budget-gib", "-1"), "--memory-budget-gib"),
])
def test_bad_input_is_one_line_exit_2(extra, needle):
    res = run("--model", "supernet-mini", "--cluster", "cpu:1x2", *extra)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and res.stdout == ""


def test_supernet_flags_refused_for_gpt():
    res = run("--model", "gpt-mini", "--cluster", "cpu:1x2", "--plan", '{"pp":2}', "--subnets", "10")
    assert res.returncode == 2 and "--subnets: applies to supernets only" in res.stderr
    # a flag given as 0 or 0.0 is given too (it was taken for "not given": 0 == False)
    res = run("--model", "gpt-mini", "--cluster", "cpu:1x2", "--plan", '{"pp":2}', "--memory-budget-gib", "0.0")
    assert res.returncode == 2 and "--memory-budget-gib: applies to supernets only" in res.stderr


def test_per_candidate_trace(tmp_path):
    from mindpipe.traces.builtin import load_supernet
    from mindpipe.traces.trace import LayerRecord, Provenance, Trace

    net = load_supernet("supernet-mini")
    recs = [LayerRecord("embedding", "embedding", 1e-4, 0.0, 0.0), LayerRecord("head", "head", 1e-3, 1e-3, 0.0)]
    recs += [LayerRecord(f"candidate.{c.name}", c.op, 2e-4, 4e-4, 0.0) for c in net.candidates]
    Trace("cpu", "fp32", recs, Provenance("test"), micro_batch_size=1, seq_len=net.seq_len, granularity="candidate",
          supernet=net).save(tmp_path / "t.json")
    res = run("--model", "supernet-mini", "--cluster", "cpu:1x2", "--plan", '{"pp":2,"subnet_schedule":"sequential"}',
              "--subnets", "10", "--trace", str(tmp_path / "t.json"), "--no-context-switch", "--json")
    assert res.returncode == 0, res.stderr
    payload = json.loads(res.stdout)
    assert payload["cost_source"] == "trace"
    # Sequential: per subnet, stage 0 = embedding + 4 candidates, stage 1 = 4 candidates + head, plus the optimizer.
    assert payload["total_time_s"] >= 10 * (1e-4 + 8 * 6e-4 + 2e-3)


def test_the_default_stream_is_whole_batches_of_a_sync_plan():
    """A ``sync`` plan trains whole batches of its window: the default 1,000 subnets are rounded up to
    them (pp 3, window 6: 1,002), where it used to refuse its own default."""
    from mindpipe.simulator.subnet_sim import SupernetSimulator
    from mindpipe.traces.builtin import load_cluster, load_network
    from mindpipe.traces.config import Plan
    from mindpipe.traces.supernet import DEFAULT_SUBNETS, default_subnets

    res = run("--model", "supernet-mini", "--cluster", "cpu:1x3", "--plan", '{"pp":3,"subnet_schedule":"sync"}', "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["num_subnets"] == 1002
    csp = Plan(pp=3, micro_batch_size=1, global_batch_size=1, subnet_schedule="csp")
    assert default_subnets(csp) == DEFAULT_SUBNETS == 1000
    sim = SupernetSimulator(load_network("supernet-mini"), load_cluster("cpu:1x3"))
    assert sim.run(csp).num_subnets == 1000
    one = run("--model", "supernet-mini", "--cluster", "cpu:1x2", "--plan", CSP, "--subnets", "1")
    assert "supernet-mini: 1 subnet, csp" in one.stdout and "1 sample each" in one.stdout
