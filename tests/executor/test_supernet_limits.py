"""A supernet simulation's size is refused before work starts (README "Limits"), not run for hours.

``--subnets`` was bounded only by ``train_steps`` (10,000,000): ``mindpipe simulate --model naspipe-c3
--subnets 10000000`` drew 480 million choices (about 8.6 s and 145 MB per 10,000 subnets measured,
so hours and far more memory than the host has). The limit is on subnets × choice layers, which
also bounds the actions (pp <= num_layers).
"""

from __future__ import annotations

import json

import pytest
from mindpipe.simulator.subnet_sim import SupernetSimulator
from mindpipe.traces.builtin import load_cluster, load_supernet
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import limit
from mindpipe.traces.schema import from_dict
from mindpipe.traces.supernet import Supernet

from .conftest import mindpipe, run_env


def test_subnets_times_layers_past_the_limit_is_refused_at_once() -> None:
    deep = from_dict(Supernet, {"kind": "supernet", "num_layers": 16384, "hidden_size": 8, "seq_len": 4,
                                "vocab_size": 16, "candidates": [{"name": "f", "op": "ffn", "ffn_hidden_size": 8}]},
                     "deep")
    sim = SupernetSimulator(deep, load_cluster("cpu:1x1"))
    plan = Plan(pp=1, micro_batch_size=1, global_batch_size=1)
    with pytest.raises(ContractError, match="524,288"):
        sim.run(plan, 64)  # 1,048,576 choices
    sim.run(plan, 2)  # 32,768 choices: fine
    assert limit("subnet_choices") >= 10_000 * 48  # NASPipe-sized streams (10,000 subnets of c3) still run


def test_cli_refuses_a_huge_stream_in_one_line() -> None:
    plan = json.dumps({"pp": 4, "micro_batch_size": 30, "global_batch_size": 30})
    res = mindpipe("simulate", "--model", "naspipe-c3", "--cluster", "a100-sxm4-80gb:1x4", "--plan", plan,
                   "--subnets", "10000000", env=run_env(), timeout=60)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "exceeds the limit" in lines[0] and "Traceback" not in res.stderr
    assert load_supernet("naspipe-c3").num_layers == 48
