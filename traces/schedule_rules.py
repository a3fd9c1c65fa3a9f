"""The pipeline schedules' names and their own rules on chunks per rank and micro-batches.

The one owner of these rules, with no dependency of its own: the :class:`~mindpipe.traces.config.Plan`
contract and :func:`~mindpipe.traces.config.check_plan` ask it (and re-export it), and so do
:func:`mindpipe.simulator.schedules.build_schedule` and the tuner's search space.
"""

from __future__ import annotations

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv", "dualpipev")
# Schedules that place two model chunks per rank in a "V" (Qi et al. ICLR'24; DeepSeek DualPipeV).
V_SCHEDULES = ("zbv", "dualpipev")
# Schedules that split a backward into input- and weight-gradient passes (zero-bubble family).
SPLIT_BACKWARD_SCHEDULES = ("zb_h1", "zbv", "dualpipev")


def fixed_virtual_stages(schedule: str) -> int | None:
    """The chunks per rank a schedule fixes: 2 for the V schedules, 1 for gpipe, 1f1b and zb_h1; None
    where any v >= 1 runs (interleaved_1f1b). :func:`virtual_stages_rule` and the tuner's space ask it."""
    return 2 if schedule in V_SCHEDULES else 1 if schedule in ("gpipe", "1f1b", "zb_h1") else None


def virtual_stages_rule(schedule: str, virtual_stages: int) -> str | None:
    """The schedule's rule on its chunks per rank (None: accepted). The one owner: :class:`~mindpipe.traces.config.Plan`
    and :func:`mindpipe.simulator.schedules.build_schedule` both ask it."""
    need = fixed_virtual_stages(schedule)
    if need is not None and virtual_stages != need:
        return f"schedule {schedule!r} needs virtual_stages={need}, got {virtual_stages}"
    return None


def microbatch_rule(schedule: str, pp: int, num_microbatches: int) -> str | None:
    """The schedule's own rule on its micro-batches m per iteration (None: accepted). The one owner:
    :func:`~mindpipe.traces.config.check_plan` and :func:`mindpipe.simulator.schedules.build_schedule` both ask it.

    Megatron's interleaved schedule needs whole groups of pp (its micro-batch ↔ chunk mapping);
    DualPipeV needs m >= 2·pp (DeepSeek's dualpipev.py and torch's ScheduleDualPipeV). (A plan
    also needs m >= pp for every schedule but GPipe, :func:`~mindpipe.traces.config.check_plan`: torch.distributed.pipelining
    refuses fewer, though the schedules themselves are defined for them.)
    """
    m = num_microbatches
    if schedule == "interleaved_1f1b" and pp > 1 and m % pp:
        return f"interleaved_1f1b needs micro-batches m={m} to be a multiple of pp={pp}"
    if schedule == "dualpipev" and m < 2 * pp:
        return f"dualpipev needs micro-batches m={m} >= 2·pp={2 * pp}"
    return None


def runtime_microbatch_rule(schedule: str, pp: int, num_microbatches: int) -> str | None:
    """What the executor's runtime (torch.distributed.pipelining) adds to :func:`microbatch_rule`
    (None: accepted). The schedules themselves are defined for these m (the simulator builds them);
    :func:`~mindpipe.traces.config.check_plan` asks both, so the simulator's check, the tuner's
    space and ``mindpipe run`` refuse a plan this runtime cannot run.

    ZB-H1 runs in torch's ``ScheduleInterleavedZeroBubble``, which splits the m micro-batches into
    max(1, m // pp) equal rounds, so m must be a multiple of that (m = 9 on pp 4 is refused, m = 10
    runs). Only the executor's pre-launch check knew it, so a tuned plan could be one it refused.
    (Interleaved 1F1B has the same rule in torch, implied by :func:`microbatch_rule`'s m % pp = 0.)
    """
    m = num_microbatches
    if schedule == "zb_h1" and pp > 1 and m % max(1, m // pp):
        return (f"zb_h1 needs micro-batches m={m} to be a multiple of max(1, m // pp)={max(1, m // pp)} "
                f"(torch's zero-bubble runtime runs them in equal rounds)")
    return None


__all__ = ["SCHEDULES", "SPLIT_BACKWARD_SCHEDULES", "V_SCHEDULES", "fixed_virtual_stages", "microbatch_rule",
           "runtime_microbatch_rule", "virtual_stages_rule"]
