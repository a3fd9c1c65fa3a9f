"""Pipeline actions and schedules: the one representation the simulator times and the executor runs.

A schedule is, for every pipeline rank, the ordered list of compute actions that rank performs in
one iteration. Actions use torch.distributed.pipelining's IR letters so that an action table can be
written in torch's CSV format and loaded by ``PipelineScheduleMulti._load_csv`` unchanged:

* ``F``  forward of one micro-batch through one (virtual) stage;
* ``B``  full backward (input and weight gradients together; torch's ``FULL_BACKWARD``);
* ``I``  input-gradient part of the backward (Qi et al.'s "B"; torch's ``BACKWARD_INPUT``);
* ``W``  weight-gradient part of the backward (torch's ``BACKWARD_WEIGHT``).

``str(Action(2, "F", 0)) == "2F0"``, exactly torch's ``_Action.__repr__``. Communication (p2p
send/recv, all-reduce) is not listed: the simulator derives it from the data dependencies, and
torch lowers a compute-only table the same way (``_add_send_recv``).

This module is pure Python (no torch) so that the simulator, tuner and executor share it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mindpipe.traces.layout import loop_stage_to_rank, v_stage_to_rank

KINDS = ("F", "B", "I", "W")
_ACTION_RE = re.compile(r"^(?P<stage>\d+)(?P<kind>F|B|I|W)(?P<mb>\d+)$")


@dataclass(frozen=True, slots=True)
class Action:
    """One compute action: ``kind`` of micro-batch ``microbatch`` on virtual stage ``stage``."""

    stage: int
    kind: str
    microbatch: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"action kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.stage < 0 or self.microbatch < 0:
            raise ValueError(f"action {self.stage}{self.kind}{self.microbatch}: indices must be >= 0")

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @staticmethod
    def parse(text: str) -> Action:
        """Parse torch's textual form (``"2F0"``, ``"1I3"``, ``"0W7"``, ``"3B1"``).

        Raises:
            ValueError: the text is not a compute action in that form.
        """
        m = _ACTION_RE.match(text.strip())
        if m is None:
            raise ValueError(f"{text!r} is not a compute action like 2F0, 1I3, 0W7 or 3B1")
        return Action(int(m["stage"]), m["kind"], int(m["mb"]))


@dataclass
class Schedule:
    """Per-rank ordered compute actions of one iteration.

    Attributes:
        name: Schedule name (``gpipe``, ``1f1b``, ``interleaved_1f1b``, ``zb_h1``, ``zbv`` …).
        pp: Pipeline ranks.
        num_microbatches: Micro-batches per iteration (m).
        num_stages: Virtual stages (pp × chunks per rank).
        stage_to_rank: Rank that runs each virtual stage.
        orders: ``orders[r]`` is rank r's action list, in execution order.
    """

    name: str
    pp: int
    num_microbatches: int
    num_stages: int
    stage_to_rank: list[int]
    orders: list[list[Action]] = field(default_factory=list)

    @property
    def split_backward(self) -> bool:
        """True when backward is split into I and W actions (zero-bubble family)."""
        return any(a.kind in ("I", "W") for order in self.orders for a in order)

    def stages_of_rank(self, rank: int) -> list[int]:
        """Virtual stages placed on ``rank``, ascending."""
        return [s for s, r in enumerate(self.stage_to_rank) if r == rank]

    def in_flight_peak(self) -> list[list[int]]:
        """Peak number of micro-batches whose activations are held, per rank and per local stage.

        A micro-batch's activations for stage s are held from its ``F`` until its backward frees
        them: ``B`` (full backward) or ``I`` (input gradient; the W pass only needs the layer
        inputs and output gradients, which are small next to the activations; Qi et al. §3
        count ZB-H1 memory as 1F1B's). The order alone determines the count, so no timing is
        needed. Returns ``peaks[r][j]`` for the j-th stage of ``stages_of_rank(r)``, and the
        per-rank peak of the sum over stages is ``rank_in_flight_peak``.
        """
        peaks: list[list[int]] = []
        for r, order in enumerate(self.orders):
            stages = self.stages_of_rank(r)
            idx = {s: j for j, s in enumerate(stages)}
            cur = [0] * len(stages)
            best = [0] * len(stages)
            for a in order:
                j = idx[a.stage]
                if a.kind == "F":
                    cur[j] += 1
                    best[j] = max(best[j], cur[j])
                elif a.kind in ("B", "I"):
                    cur[j] -= 1
            peaks.append(best)
        return peaks

    def rank_in_flight_peak(self) -> list[int]:
        """Per rank, the peak over time of the held micro-batch activations summed over its stages.

        Counted in units of one stage's activations for one micro-batch; with unequal chunk
        sizes use :meth:`in_flight_timeline` and weight each stage.
        """
        out = []
        for order in self.orders:
            cur = best = 0
            for a in order:
                if a.kind == "F":
                    cur += 1
                    best = max(best, cur)
                elif a.kind in ("B", "I"):
                    cur -= 1
            out.append(best)
        return out

    def in_flight_timeline(self, rank: int) -> list[dict[int, int]]:
        """After each action of ``rank``, the held micro-batches per local stage."""
        stages = self.stages_of_rank(rank)
        out: list[dict[int, int]] = []
        if len(stages) == 1:  # the common case, without a dict update per action
            only, held = stages[0], 0
            for a in self.orders[rank]:
                if a.kind == "F":
                    held += 1
                elif a.kind != "W":
                    held -= 1
                out.append({only: held})
            return out
        cur = dict.fromkeys(stages, 0)
        for a in self.orders[rank]:
            if a.kind == "F":
                cur[a.stage] += 1
            elif a.kind != "W":
                cur[a.stage] -= 1
            out.append(cur.copy())
        return out


# loop_stage_to_rank and v_stage_to_rank are the plan rules of traces.layout, re-exported for the schedules.
__all__ = ["KINDS", "Action", "Schedule", "loop_stage_to_rank", "v_stage_to_rank"]
