"""The tensor-parallel collectives a run issues are the ones the simulator prices.

A tp2 run with its last step profiled records every collective with its operation and size; per
micro-batch, rank 0's must match :func:`mindpipe.simulator.calibrate.features.action_collectives`
(the blocks' :func:`~mindpipe.simulator.costs.tp_collectives` and the vocabulary-parallel layers'
:func:`~mindpipe.simulator.costs.vocab_collectives`, as the engine and the calibration read them).
Under sequence parallelism the norms' partial weight gradients are all-reduced once per step,
in one message (:mod:`mindpipe.executor.partial_grads`; the simulator's
:func:`~mindpipe.simulator.costs.partial_grad_params`), where DTensor alone would issue one
all-reduce per norm parameter in the optimizer step. gloo has no reduce-scatter: the executor's reduce-scatters run as all-reduces of the whole tensor,
and the profiler sizes an all-gather by its input, the shard. Not compared, and not priced by the
simulator: the loss's scalar sum (the executor's vocabulary-parallel loss sums the
tokens' losses over the group where Megatron all-reduces the target logits; both make three
per-token all-reduces, which are compared).
"""

from __future__ import annotations

from collections import Counter

import pytest
from mindpipe.executor.noise_probe import noise_method
from mindpipe.simulator.calibrate.features import action_collectives, stage_structure_costs
from mindpipe.simulator.calibrate.models import as_run
from mindpipe.simulator.costs import partial_grad_params
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
    measured = Counter((c.op, c.size_bytes) for c in meas.comms
                       if c.kind == "collective" and c.axis == "tp" and c.rank == 0
                       and c.size_bytes is not None)
    simulated: Counter[tuple[str, int]] = Counter()
    for (_, kind), colls in action_collectives(model, plan).items():
        if kind in ("F", "B"):
            for c in colls:
                op = as_run(c.op, "gloo")
                size = int(c.nbytes) // plan.tp if op == "allgather" else int(c.nbytes)
                simulated[(op, size)] += plan.num_microbatches
    # Sequence parallelism's norm gradients: one all-reduce per step (Megatron's), priced by the
    # simulator's rank work, plus the noise probe's read of the first micro-batch's gradient.
    norms = partial_grad_params(model, plan, stage_structure_costs(model, plan)) * 4
    assert (norms > 0) == sp
    if sp:
        simulated[("allreduce", norms)] += 1 + (noise_method(plan, model) == "microbatch")
    assert sum(simulated.values()) > 0
    assert measured == simulated
