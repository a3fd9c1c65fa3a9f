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
from pathlib import Path
from typing import Any

from mindpipe.cli.output import check_outputs
from mindpipe.traces.atomic import classify
from mindpipe.traces.catalog import DeviceSpec
from mindpipe.traces.config import Cluster, Model, Plan
from mindpipe.traces.errors import ContractError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``run`` subcommand to ``sub`` and return its parser."""
    from mindpipe.executor.config import add_run_arguments  # torch-free

    p = sub.add_parser("run", help="train a plan with torch.distributed and measure it (on one CPU host MindPipe's "
                       "rank spawner forks the ranks; on GPUs or several nodes torchrun starts them)")
    add_run_arguments(p, launcher=True)
    p.set_defaults(func=cmd_run)
    return p


def cmd_run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Validate the plan, launch torchrun and wait (the executor's :func:`~mindpipe.executor.launch.cmd_run`);
    then, unless ``--json``, each pipeline rank's measured peak memory against the simulator's."""
    from mindpipe.executor.launch import cmd_run as run_plan

    # rank 0 writes them at the end: refused now, not after training
    check_outputs([args.out, args.timeline], inputs=[args.plan, args.model, args.data])
    for path in (args.out, args.timeline):
        if path is not None and classify(path)[0] == "stream":
            raise ContractError(path, None, "is a device or pipe: rank 0's process writes this output (and the "
                                "launcher reads the measured trace back), so give a file")
    code = run_plan(args, argv, memory_check=memory_check)
    if code == 0 and not args.json and Path(args.out).is_file():
        for line in memory_lines(Path(args.out)):
            print(line)
    return code


def memory_lines(measured: Path) -> list[str]:
    """One line per pipeline rank of a measured run: its peak memory (the largest of its replicas)
    and the simulator's for the same plan (:func:`~mindpipe.simulator.calibrate.memory_fidelity.memory_rows`)."""
    from mindpipe.simulator.calibrate.memory_fidelity import action_memory_rows, largest_replica, memory_rows
    from mindpipe.traces.trace import Trace

    trace = Trace.load(measured)
    m = trace.measurement
    if m is None or trace.model is None or trace.supernet is not None:
        return []
    try:
        rows = memory_rows(m, trace.model)
    except ContractError as e:  # a device the catalog does not know: the run stands, the comparison cannot be made
        return [f"memory: not compared with the simulator ({e})"]
    source = {"cuda_allocator": "CUDA allocator's peak", "tensor_accounting": "live-tensor accounting"}
    lines = [f"memory, pipeline rank {r.pp_rank}: measured {r.measured_bytes / 2**20:.1f} MiB "
             f"({source.get(r.source, r.source)}), simulated {r.predicted_bytes / 2**20:.1f} MiB ({100 * r.rel_error:+.2f} %)"
             for r in largest_replica(rows)]
    by_action = action_memory_rows(m, trace.model)
    for pp in sorted({a.pp_rank for a in by_action}):
        mine = [a for a in by_action if a.pp_rank == pp]
        worst = max(mine, key=lambda a: abs(a.rel_error))
        lines.append(f"memory per action, pipeline rank {pp}: worst {100 * worst.rel_error:+.2f} % ({worst.action}) "
                     f"over {len(mine)} actions of the last step (accounted)")
    return lines


def memory_check(model: Model, plan: Plan, device: DeviceSpec, ranks_per_device: int) -> list[float]:
    """Per-rank GiB of ``plan`` on ``device``; raises ContractError when a rank does not fit.

    ``device`` is looked up as given, so an emulated capacity (``--memory-budget-gib``) counts.
    """
    from mindpipe.simulator.simulator import Simulator

    cluster = Cluster(gpu=device.name, num_nodes=1, gpus_per_node=plan.world_size)
    return Simulator(model, cluster, catalog={device.name.lower(): device}).refuse_unless_fits(plan, ranks_per_device)


__all__ = ["add_parser", "cmd_run", "memory_check", "memory_lines"]
