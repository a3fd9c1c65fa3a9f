"""Action tables on disk in torch.distributed.pipelining's "compute_only" CSV format.

One row per pipeline rank (row i is rank i), one cell per compute action in execution order,
each cell ``str(action)`` (``0F0,0F1,0B0``), no header: what ``PipelineScheduleMulti._dump_csv``
writes and ``PipelineScheduleMulti._load_csv`` / ``_PipelineScheduleRuntime._load_csv`` read
(torch/distributed/pipelining/schedules.py). The executor loads the file this module writes with
torch's own loader, so the run executes the order the simulator timed (DESIGN.md "One schedule
implementation").

Reading accepts what torch itself writes for compute-only tables: empty cells (torch's idle
``None`` slots) are skipped and a fused ``(0F3;1B2)OVERLAP_F_B`` cell (DualPipeV) becomes its
sub-actions in order, the split form :func:`mindpipe.simulator.schedules.build_schedule` uses.
"""

from __future__ import annotations

import csv
from pathlib import Path

from mindpipe.simulator.actions import Action, Schedule
from mindpipe.simulator.schedules import validate_schedule
from mindpipe.traces import reading
from mindpipe.traces.atomic import open_output
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import limit

_OVERLAP = "OVERLAP_F_B"


def write_csv(schedule: Schedule, path: str | Path) -> None:
    """Write ``schedule`` as torch compute-only CSV (one row per rank).

    Raises:
        ValueError: the schedule is incomplete, misplaced or deadlocks (see
            :func:`~mindpipe.simulator.schedules.validate_schedule`); torch would hang on such a table.
    """
    validate_schedule(schedule)
    with open_output(path, newline="") as f:
        writer = csv.writer(f)
        for order in schedule.orders:
            writer.writerow([str(a) for a in order])


def _parse_cell(text: str) -> list[Action]:
    """The compute actions in one cell; ValueError (with the rule) if it holds anything else."""
    cell = text.strip()
    if not cell:
        return []
    if cell.startswith("(") and cell.endswith(")" + _OVERLAP):
        inner = cell[1 : -len(_OVERLAP) - 1]
        return [a for part in inner.split(";") for a in _parse_cell(part)]
    try:
        return [Action.parse(cell)]
    except ValueError:
        raise ValueError(f"{cell!r} is not a compute action like 2F0, 1I3, 0W7 or 3B1 (compute_only format; "
                         "send/recv and other torch IR actions are not allowed)") from None


def _cell_rule(a: Action, r: int, placed: dict[int, tuple[int, str]], stage_to_rank: list[int] | None,
               m: int | None) -> str | None:
    """The rule ``a`` on row ``r`` breaks, if any."""
    if a.stage in placed and placed[a.stage][0] != r:
        return f"{a} puts stage {a.stage} on rank {r}, but {placed[a.stage][1]} put it on rank {placed[a.stage][0]}"
    if stage_to_rank is not None:
        if a.stage >= len(stage_to_rank):
            return f"{a} names stage {a.stage}, but the given stage_to_rank has {len(stage_to_rank)} stages"
        if stage_to_rank[a.stage] != r:
            return f"{a} runs on rank {r}, but the given stage_to_rank places stage {a.stage} on rank {stage_to_rank[a.stage]}"
    if m is not None and a.microbatch >= m:
        return f"{a} names micro-batch {a.microbatch}, but num_microbatches={m}"
    return None


def read_csv(path: str | Path, name: str, num_microbatches: int | None = None,
             stage_to_rank: list[int] | None = None) -> Schedule:
    """Read a torch compute-only action table into a :class:`~mindpipe.simulator.actions.Schedule`.

    pp is the number of rows; the number of stages and micro-batches are inferred from the cells
    (largest index + 1) and the placement from which rank runs which stage.

    Args:
        path: The CSV file.
        name: Schedule name to record (the file does not carry one).
        num_microbatches: Expected m; every cell must stay below it and every micro-batch appear.
        stage_to_rank: Expected placement; the table must agree with it.

    Raises:
        ContractError: source ``path``, key ``row R (rank r), cell C`` where a cell is at fault,
            naming the rule; also for tables that are incomplete or deadlock.
    """
    src = str(path)
    rows = reading.read_csv(path, reading.ACTION_TABLE)
    if not rows:
        raise ContractError(src, None, "the action table has no rows (one row per pipeline rank expected)")
    orders: list[list[Action]] = []
    placed: dict[int, tuple[int, str]] = {}  # stage -> (rank, where first seen)
    max_mb = -1
    for r, row in enumerate(rows):
        order: list[Action] = []
        for c, text in enumerate(row):
            where = f"row {r + 1} (rank {r}), cell {c + 1}"
            try:
                actions = _parse_cell(text)
            except ValueError as e:
                raise ContractError(src, where, str(e)) from None
            for a in actions:
                if a.stage >= limit("microbatch_stages") or a.microbatch >= limit("micro_batches"):
                    raise ContractError(src, where, f"{a} is past the limits of {limit('microbatch_stages'):,} stages "
                                                    f"and {limit('micro_batches'):,} micro-batches")
                rule = _cell_rule(a, r, placed, stage_to_rank, num_microbatches)
                if rule:
                    raise ContractError(src, where, rule)
                placed.setdefault(a.stage, (r, where))
                max_mb = max(max_mb, a.microbatch)
                order.append(a)
        if not order:
            raise ContractError(src, f"row {r + 1} (rank {r})", "rank has no actions; every rank must hold a stage")
        orders.append(order)
    n_st = max(placed) + 1
    missing = [s for s in range(n_st) if s not in placed]
    if missing:
        raise ContractError(src, None, f"stages {missing} appear in no cell (stages 0..{n_st - 1} expected)")
    if stage_to_rank is not None and len(stage_to_rank) != n_st:
        raise ContractError(src, None, f"the table has {n_st} stages, the given stage_to_rank {len(stage_to_rank)}")
    m = num_microbatches if num_microbatches is not None else max_mb + 1
    schedule = Schedule(name, len(orders), m, n_st, [placed[s][0] for s in range(n_st)], orders)
    try:
        validate_schedule(schedule)
    except ValueError as e:
        raise ContractError(src, None, str(e)) from e
    return schedule


__all__ = ["read_csv", "write_csv"]
