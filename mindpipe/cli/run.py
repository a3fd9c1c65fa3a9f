"""``mindpipe run PLAN --nproc N --steps S``: train a plan under torchrun (the executor's handler).

The arguments are :func:`mindpipe.executor.config.add_run_arguments` (torch-free) and the handler
is :func:`mindpipe.executor.launch.cmd_run`, imported only when the command runs. The executor
does not model memory (it imports nothing of the simulator but the schedules): this command gives
it the simulator's memory check (:meth:`~mindpipe.simulator.simulator.Simulator.refuse_unless_fits`),
so a plan that cannot fit is refused before any process starts.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from mindpipe.cli.output import check_outputs
from mindpipe.traces.catalog import DeviceSpec
from mindpipe.traces.config import Cluster, Model, Plan


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``run`` subcommand to ``sub`` and return its parser."""
    from mindpipe.executor.config import add_run_arguments  # torch-free

    p = sub.add_parser("run", help="train a plan with torch.distributed (wraps torchrun) and measure it")
    add_run_arguments(p, launcher=True)
    p.set_defaults(func=cmd_run)
    return p


def cmd_run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Validate the plan, launch torchrun and wait (the executor's :func:`~mindpipe.executor.launch.cmd_run`)."""
    from mindpipe.executor.launch import cmd_run as run_plan

    check_outputs([args.out, args.timeline])  # rank 0 writes them at the end: refused now, not after training
    return run_plan(args, argv, memory_check=memory_check)


def memory_check(model: Model, plan: Plan, device: DeviceSpec, ranks_per_device: int) -> list[float]:
    """Per-rank GiB of ``plan`` on ``device``; raises ContractError when a rank does not fit.

    ``device`` is looked up as given, so an emulated capacity (``--memory-budget-gib``) counts.
    """
    from mindpipe.simulator.simulator import Simulator

    cluster = Cluster(gpu=device.name, num_nodes=1, gpus_per_node=plan.world_size)
    return Simulator(model, cluster, catalog={device.name.lower(): device}).refuse_unless_fits(plan, ranks_per_device)


__all__ = ["add_parser", "cmd_run", "memory_check"]
