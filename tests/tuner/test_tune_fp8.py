"""``tune --fix precision=fp8``: only plans ``mindpipe run`` carries out (torchao fp8 runs with tp = 1)."""

from __future__ import annotations

from mindpipe.executor.fp8 import fp8_refusal
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Plan
from mindpipe.tuner.keys import parse_fixes
from mindpipe.tuner.space import SearchSpace


def test_fp8_points_are_ones_the_executor_runs():
    """The tuner said "every plan is one the executor runs" and picked dp2·tp2·pp2 fp8 for llama3-8b,
    which `mindpipe run` refuses (fp8 with tp > 1)."""
    h100 = load_cluster("h100-sxm5-80gb:1x8")
    space = SearchSpace(load_model("llama3-8b"), h100, [32], parse_fixes(["precision=fp8"]))
    assert space.size > 0 and {p["tp"] for p in space.points} == {1}
    device = get_device("h100-sxm5-80gb")
    for p in space.points[:50]:
        plan = Plan(dp=p["dp"], tp=p["tp"], pp=p["pp"], cp=p["cp"], micro_batch_size=p["micro_batch_size"],
                    global_batch_size=p["global_batch_size"], precision="fp8")
        refusal = fp8_refusal(plan, "cuda", device)
        assert refusal is None or "torchao" in refusal  # only a missing install, never the plan itself
    bf16 = SearchSpace(load_model("llama3-8b"), h100, [32])
    assert {p["tp"] for p in bf16.points} > {1}  # bf16 keeps every tensor-parallel degree
