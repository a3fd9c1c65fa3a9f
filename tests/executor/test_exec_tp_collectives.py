"""The tensor-parallel collectives a run issues are the ones the simulator prices.

A tp2 run with its last step profiled records every collective with its operation and size; per
micro-batch, rank 0's must match :func:`mindpipe.simulator.calibrate.features.action_collectives`
(the blocks' :func:`~mindpipe.simulator.costs.tp_collectives` and the vocabulary-parallel layers'
:func:`~mindpipe.simulator.costs.vocab_collectives`, as the engine and the calibration read them).
gloo has no reduce-scatter: the executor's reduce-scatters run as all-reduces of the whole tensor,
and the profiler sizes an all-gather by its input, the shard. Not compared, and not priced by the
simulator: the all-reduces of replicated parameters' gradients (norms, row-parallel biases;
hidden-size vectors), and the loss's scalar sum (the executor's vocabulary-parallel loss sums the
tokens' losses over the group where Megatron all-reduces the target logits; both make three
per-token all-reduces, which are compared).
"""

from __future__ import annotations

from collections import Counter

import pytest
from mindpipe.simulator.calibrate.features import action_collectives
from mindpipe.simulator.calibrate.models import as_run
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.trace import Trace

from .conftest import TINY, run_plan

BASE = {"tp": 2, "micro_batch_size": 4, "global_batch_size": 8, "precision": "fp32"}


@pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2_sequence_parallel"])
def test_tensor_parallel_collectives_are_the_simulated_ones(tmp_path, sp):
    plan_dict = {**BASE, "sequence_parallel": sp}
    res = run_plan(tmp_path, plan_dict, 2, "--profile-step", "3", steps=3)
    assert res.returncode == 0, res.stderr[-4000:]
    meas = Trace.load(tmp_path / "measured.json").measurement
    plan, model = Plan(**plan_dict), Model(**TINY)
    hidden_vector = model.hidden_size * 4  # a replicated parameter's gradient (fp32)
    measured = Counter((c.op, c.size_bytes) for c in meas.comms
                       if c.kind == "collective" and c.axis == "tp" and c.rank == 0
                       and c.size_bytes not in (None, hidden_vector))
    simulated: Counter[tuple[str, int]] = Counter()
    for (_, kind), colls in action_collectives(model, plan).items():
        if kind in ("F", "B"):
            for c in colls:
                op = as_run(c.op, "gloo")
                size = int(c.nbytes) // plan.tp if op == "allgather" else int(c.nbytes)
                simulated[(op, size)] += plan.num_microbatches
    assert sum(simulated.values()) > 0
    assert measured == simulated
