"""The pipeline schedule a rank runs: torch's class of the plan's schedule, or the simulator's table.

``torch``: the schedule class torch ships for the plan's schedule name (``1f1b`` →
``Schedule1F1B``, ``interleaved_1f1b`` → ``ScheduleInterleaved1F1B``, ``zb_h1`` →
``ScheduleInterleavedZeroBubble`` with one stage per rank — torch's ZB1P, i.e. ZB-H1 —,
``zbv`` → ``ScheduleZBVZeroBubble``, ``dualpipev`` → ``ScheduleDualPipeV``).

``simulator``: :func:`mindpipe.simulator.schedules.build_schedule` produces the per-rank action lists the
simulator times; :func:`mindpipe.simulator.action_table.write_csv` writes them in torch's compute-only CSV
format and torch's runtime executes that table (:func:`mindpipe.executor.torch_pipelining.table_schedule`).
So a measured run and a simulated one follow the same order, action for action (DESIGN.md "One
schedule implementation").
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mindpipe.executor.precheck import TORCH_SCHEDULES
from mindpipe.executor.rundir import RUN_DIR_ENV
from mindpipe.executor.torch_pipelining import named_schedule, schedule_orders, table_schedule
from mindpipe.simulator.actions import Schedule
from mindpipe.traces.config import Plan
from mindpipe.traces.torch_gpt import VocabShard, plan_loss
from torch import Tensor
from torch.distributed.pipelining import PipelineStage

LossFn = Callable[[Tensor, Tensor], Tensor]


def simulator_schedule(plan: Plan) -> Schedule:
    """The simulator's schedule of ``plan`` (the action table it times)."""
    from mindpipe.simulator.schedules import build_schedule

    return build_schedule(plan.schedule, plan.pp, plan.num_microbatches, plan.virtual_stages)


def write_simulator_table(plan: Plan, path: str | Path) -> None:
    """Write the simulator's action table of ``plan`` as torch compute-only CSV."""
    from mindpipe.simulator.action_table import write_csv

    write_csv(simulator_schedule(plan), path)


def make_schedule(plan: Plan, stages: list[PipelineStage], source: str,
                  wrap_loss: Callable[[LossFn], LossFn] | None = None,
                  shard: VocabShard | None = None) -> tuple[Any, dict[int, list[str]]]:
    """Build this rank's schedule; also return the per-rank compute orders it follows.

    Args:
        plan: The plan (schedule name, pp, micro-batches, virtual stages; ``loss_chunks`` for
            the loss the last stage computes, :func:`mindpipe.traces.torch_gpt.plan_loss`).
        stages: This rank's pipeline stages, ascending stage index.
        source: ``torch`` or ``simulator`` (already resolved).
        wrap_loss: Wraps the loss (the memory account counts its backward's temporaries,
            :meth:`mindpipe.executor.memory_account.MemoryAccount.counting_loss`).
        shard: Under tensor parallelism, the slice of the vocabulary this rank's LM head computes
            (its loss is vocabulary-parallel); None otherwise.

    Under ``fused_head_loss`` the last stage's output is its loss already
    (:class:`mindpipe.executor.stages.StageModule`): the schedule's loss passes it through, unwrapped.
    """
    m = plan.num_microbatches
    if plan.fused_head_loss:
        loss: LossFn = _stage_output_is_the_loss
    else:
        loss = plan_loss(plan, shard)
        if wrap_loss is not None:
            loss = wrap_loss(loss)
    if source == "simulator":
        # Inside the launcher's run directory where there is one: it is removed with the run even
        # when a rank is killed before this block cleans up.
        with tempfile.TemporaryDirectory(prefix="mindpipe-table-", dir=os.environ.get(RUN_DIR_ENV)) as tmp:
            path = Path(tmp) / f"{plan.schedule}.csv"
            write_simulator_table(plan, path)
            schedule = table_schedule(path, stages, m, loss)
    else:
        schedule = named_schedule(TORCH_SCHEDULES[plan.schedule], stages, m, loss)
    return schedule, schedule_orders(schedule)


def _stage_output_is_the_loss(output: Tensor, target: Tensor) -> Tensor:
    return output


__all__ = ["make_schedule", "simulator_schedule", "write_simulator_table"]
