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
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

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


class Held(NamedTuple):
    """What one stage of a rank holds after an action (:meth:`Schedule.held_timeline`).

    Attributes:
        awaiting_input: Micro-batches past their ``F`` awaiting their input gradient (``B`` or ``I``).
        awaiting_weight: Micro-batches past their ``I`` awaiting their ``W`` (split backward only).
        has_grads: The stage's weight gradients exist in this iteration (after its first ``B``, or
            its first ``W`` under a split backward).
        grads_reduced: The stage's last ``B`` or ``W`` of the iteration has run: torch's pipelining
            runtime reduces its gradients right after it (``_add_reduce_grad``, "reduce_grad frees
            memory"), so a wrapper that shards them (FSDP2 under ZeRO ≥ 1) holds only its shard from
            then on (:func:`mindpipe.traces.layout.shards_reduced_gradients`), and FSDP2 frees the
            whole weights it gathered for the stage (:func:`mindpipe.traces.layout.keeps_gathered_weights`).
            On a rank of several stages the first to finish does so while the others still run.
        backward_next: The rank's next action is a backward (``B``, ``I`` or ``W``) of this stage,
            whose transients (a redone block, the loss's gradients) then come on top of what is held
            here. Per stage: on a rank of several stages, one stage's transient (the last stage's
            loss) never meets another's gradients it precedes (measured: stage 3's loss backward
            before stage 1's first backward on interleaved pp2).
        next_kind: That backward's kind (``B``, ``I`` or ``W``; "" when ``backward_next`` is false).
        next_sets: How many micro-batches of this stage have a prefetched swapped block on the
            device while it runs (:func:`prefetched_backward`; the schedule's lazy stages get none):
            its own (a ``B`` or ``I`` prefetched under the action before it) plus the next
            backward's of the same stage when that is prefetched under this one (1F1B's
            cool-down pair; after a ``W``, the next ``I``'s).
        next_across: The other stage of the rank whose next backward is prefetched while it runs
            (its last swapped block is back beside this one's transient), or -1.
        step_done: The rank's last action of the step has run (every stage alike): nothing is
            computed until the optimizer step, so no layer is gathered for it.
    """

    awaiting_input: int
    awaiting_weight: int
    has_grads: bool
    backward_next: bool = False
    grads_reduced: bool = False
    next_kind: str = ""
    next_sets: int = 0
    next_across: int = -1
    step_done: bool = False


_KIND_CODES = {"F": 0, "B": 1, "I": 2, "W": 3}


def follows_own_forward(order: Sequence[Action], i: int) -> bool:
    """True when ``order[i]`` is a backward (B or I) whose own micro-batch's forward is the action
    just before it on the rank (1F1B's last stage, one micro-batch per iteration)."""
    a = order[i]
    return a.kind in ("B", "I") and i > 0 and order[i - 1] == Action(a.stage, "F", a.microbatch)


def prefetched_backward(order: Sequence[Action], i: int, lazy: Collection[int] = ()) -> Action | None:
    """The backward whose last swapped block comes back to the device while ``order[i]`` runs, or None.

    vPipe's prefetch (BACKGROUND.md §4.2): the copy back of the next action's last swapped block
    (the first its backward needs), when it is a backward (B or I) that does not directly follow
    its own forward, starts with the action before it, so it hides under that action's compute;
    the backward brings back its other swapped blocks one ahead as it runs
    (:func:`mindpipe.simulator.work.swap_chain_stall_s`). A backward right after its own forward
    gets nothing ahead: its bytes reach the host only after that forward, and its last swapped
    block comes back as the backward asks for it. The engine times this (``Engine._prefetch``), the
    memory model counts the copies while they are on the device (``StageMemoryModel.stage``'s
    ``prefetch``) and the executor runs it (:func:`mindpipe.executor.offload.install_prefetch`).
    A stage in ``lazy`` (``Plan.swap_copy_back``, :func:`mindpipe.traces.layout.lazy_copy_back`) is
    never prefetched: its backwards ask for their bytes as they go, as one after its own forward does.
    """
    if i + 1 >= len(order) or order[i + 1].kind not in ("B", "I") or follows_own_forward(order, i + 1) \
            or order[i + 1].stage in lazy:
        return None
    return order[i + 1]


def _signature(order: tuple[Action, ...] | list[Action], stages: tuple[int, ...], lazy: Collection[int] = ()) -> bytes:
    """What of ``order`` decides what its stages hold: per action its kind, which of ``stages`` it
    runs and whether its last swapped block was prefetched under the action before it
    (:func:`prefetched_backward`; three bytes: micro-batch ids do not matter). A compact cache key for
    :func:`_undominated`: a few KB where the actions themselves would keep whole schedules alive."""
    where = {s: j for j, s in enumerate(stages)}
    return bytes(b for i, a in enumerate(order)
                 for b in (_KIND_CODES[a.kind], where[a.stage], i > 0 and prefetched_backward(order, i - 1, lazy) is not None))


_TAIL = 4  # what _counts says of the next action: its stage + 1 (0: a forward or nothing), kind code, sets, across + 1
_END = len(KINDS)  # the kind code after the rank's last action
_FORWARD_NEXT, _AT_END = (0,) * _TAIL, (0, _END, 0, 0)


def _counts(signature: bytes, n: int) -> list[tuple[int, ...]]:
    """Per action of a :func:`_signature` over ``n`` stages, what they hold as one flat tuple of
    integers: the micro-batches awaiting their input gradient per stage, then those awaiting W,
    then the gradients per stage (0: none yet, 1: reduced after the stage's last B or W, 2: whole —
    ordered by the memory they may take), then what runs next when it is a backward (its stage's
    index + 1, its kind's code, :attr:`Held.next_sets` and the index + 1 of
    :attr:`Held.next_across`; all 0 before a forward, and the kind code ``_END`` after the last
    action) — :func:`_timeline`'s entries without the objects."""
    awaiting_input, awaiting_weight, grads = [0] * n, [0] * n, [0] * n
    kinds, where, ahead = signature[0::3], signature[1::3], signature[2::3]
    last = {where[i]: i for i, kind in enumerate(kinds) if kind in (1, 3)}  # each stage's last B or W
    out: list[tuple[int, ...]] = []

    def following(k: int) -> tuple[int, ...]:
        if k >= len(kinds):
            return _AT_END
        if kinds[k] == 0:
            return _FORWARD_NEXT
        j = where[k]
        after = k + 1 < len(kinds) and ahead[k + 1]  # the action after k is prefetched under it
        same = bool(after) and where[k + 1] == j
        across = where[k + 1] + 1 if after and not same else 0
        own = ahead[k] if kinds[k] in (1, 2) else 0
        return (j + 1, kinds[k], own + same, across)

    for i, kind in enumerate(kinds):
        j = where[i]
        if kind == 0:  # F
            awaiting_input[j] += 1
        elif kind == 1:  # B
            awaiting_input[j] -= 1
            grads[j] = 1 if last[j] == i else 2
        elif kind == 2:  # I
            awaiting_input[j] -= 1
            awaiting_weight[j] += 1
        else:  # W
            awaiting_weight[j] -= 1
            grads[j] = 1 if last[j] == i else 2
        out.append((*awaiting_input, *awaiting_weight, *grads, *following(i + 1)))
    return out


def _held(counts: tuple[int, ...], stages: tuple[int, ...]) -> tuple[Held, ...]:
    n = len(stages)
    nxt, kind, sets, across = counts[3 * n:3 * n + _TAIL]
    done = kind == _END
    return tuple(Held(counts[j], counts[n + j], counts[2 * n + j] > 0, nxt == j + 1, counts[2 * n + j] == 1,
                      *((KINDS[kind], sets, stages[across - 1] if across else -1) if nxt == j + 1 else ("", 0, -1)),
                      done)
                 for j in range(n))


def _timeline(order: tuple[Action, ...] | list[Action], stages: tuple[int, ...],
              lazy: Collection[int] = ()) -> list[tuple[Held, ...]]:
    """Per action of ``order``, what each of ``stages`` holds (:meth:`Schedule.held_timeline`)."""
    return [_held(c, stages) for c in _counts(_signature(order, stages, lazy), len(stages))]


@lru_cache(maxsize=1024)
def _undominated(signature: bytes, stages: tuple[int, ...]) -> tuple[tuple[Held, ...], ...]:
    """Distinct timeline entries no other entry dominates (:meth:`Schedule.held_states`), first-seen order."""
    n = len(stages)

    def covers(b: tuple[int, ...], a: tuple[int, ...]) -> bool:
        # Same micro-batches awaiting W; no fewer awaiting input or gradients; the same backward
        # next (stage, kind, prefetched sets and the stage prefetched across it), or in ``a`` the
        # step's end (nothing next) or a forward (not covered by the end: a forward's gathered layers).
        ta, tb = a[3 * n:], b[3 * n:]
        return b[n:2 * n] == a[n:2 * n] and all(y >= x for x, y in zip(a[:n], b[:n], strict=True)) and \
            all(y >= x for x, y in zip(a[2 * n:3 * n], b[2 * n:3 * n], strict=True)) and \
            (ta in (tb, _AT_END) or (ta == _FORWARD_NEXT and tb != _AT_END))

    distinct = list(dict.fromkeys(_counts(signature, n)))
    # Pareto filter: in this order an entry's dominators come before it (they are no smaller in
    # every sum), and one that a dropped entry dominates is dominated by a kept one (transitivity).
    frontier: list[tuple[int, ...]] = []
    for a in sorted(distinct, key=lambda e: (sum(e[:n]), sum(e[2 * n:3 * n]), e[3 * n] != 0, e[3 * n + 1] != _END),
                    reverse=True):
        if not any(covers(b, a) for b in frontier):
            frontier.append(a)
    kept = set(frontier)
    return tuple(_held(a, stages) for a in distinct if a in kept)


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

    def round_trip_share(self, stage: int) -> float:
        """The share of ``stage``'s backwards (B or I) that directly follow their own forward on the
        rank (:func:`prefetched_backward` does not apply to them); 0 for a stage without any."""
        order = self.orders[self.stage_to_rank[stage]]
        backs = [i for i, a in enumerate(order) if a.stage == stage and a.kind in ("B", "I")]
        return sum(1 for i in backs if follows_own_forward(order, i)) / len(backs) if backs else 0.0

    def prefetched_sets(self, stage: int, lazy: Collection[int] = ()) -> int:
        """Most micro-batches of ``stage`` with a prefetched swapped block on the device at once
        (:func:`prefetched_backward`; the prefetch brings back a backward's last swapped block): 0
        where no backward of the stage is prefetched; 1 where each prefetch runs under a forward;
        2 where one runs under a prefetched backward of the same stage (1F1B's cool-down). ``lazy``:
        the stages that copy back as they ask (:func:`prefetched_backward`)."""
        order = self.orders[self.stage_to_rank[stage]]
        ahead = [(a := prefetched_backward(order, i, lazy)) is not None and a.stage == stage for i in range(len(order))]
        return max((ahead[i] + (i > 0 and ahead[i - 1]) for i in range(len(order))), default=0)

    def prefetched_across(self, stage: int, lazy: Collection[int] = ()) -> frozenset[int]:
        """The other stages whose next backward the executor starts prefetching as a backward
        (B, I or W) of ``stage`` begins, so that their last swapped block is on the device during it.

        :func:`~mindpipe.executor.offload.install_prefetch` defers only a prefetch named after a B or
        I of the same stage (1F1B's cool-down: :meth:`prefetched_sets` counts it); one for another
        stage of the rank (interleaved and V schedules hold several) starts with the action. Measured
        on llama-tiny pp2 interleaved (v 2, every second block swapped): during stage 3's last
        backward, with the loss's temporaries, stage 1's next swapped block was already back."""
        order = self.orders[self.stage_to_rank[stage]]
        out = set()
        for i, a in enumerate(order):
            if a.stage == stage and a.kind in ("B", "I", "W"):
                nxt = prefetched_backward(order, i, lazy)
                if nxt is not None and nxt.stage != stage:
                    out.add(nxt.stage)
        return frozenset(out)

    def stages_of_rank(self, rank: int) -> list[int]:
        """Virtual stages placed on ``rank``, ascending."""
        return [s for s, r in enumerate(self.stage_to_rank) if r == rank]

    def held_timeline(self, rank: int, lazy: Collection[int] = ()) -> list[dict[int, Held]]:
        """After each action of ``rank``, per local stage: what it holds (:class:`Held`), and what
        the backward that comes next has on the device beside it (``lazy``: the stages that copy
        back as they ask, :func:`prefetched_backward`).

        A micro-batch's activations for stage s are held from its ``F`` until the backward that
        frees them. ``B`` frees them all. Under a split backward, torch's ``stage_backward_input``
        runs the input gradient with ``retain_graph=True`` and keeps the graph for
        ``stage_backward_weight``: what the stage saved stays until ``W``, except the nodes on
        the loss's side of the first weight (the LM head's log-softmax), which ``I`` releases when
        it detaches the stage's outputs (measured with the executor's live-tensor accounting:
        :mod:`mindpipe.executor.memory_account`). Qi et al. (ICLR'24) count ZB-H1 memory as if
        ``I`` freed everything; that is not what torch runs. Which bytes each phase holds is
        :class:`mindpipe.simulator.memory.StageMemoryModel`'s; this only counts micro-batches.

        Weight gradients exist from the stage's first ``B`` (or ``W``) of the iteration on: torch
        frees them at the step (``zero_grad(set_to_none=True)``) and autograd allocates them in the
        backward, so the forwards of a warm-up (1F1B's first stage at m ≤ p, any plan with one
        micro-batch) hold their activations without them.
        """
        stages = tuple(self.stages_of_rank(rank))
        return [dict(zip(stages, state, strict=True)) for state in _timeline(self.orders[rank], stages, lazy)]

    def held_states(self, rank: int, lazy: Collection[int] = ()) -> list[dict[int, Held]]:
        """The entries of :meth:`held_timeline` a peak can be at, in the order they first occur.

        A memory peak over the timeline (what :class:`mindpipe.simulator.memory.StageMemoryModel`
        computes) is non-decreasing in every stage's micro-batches awaiting their input gradient,
        in its gradients being present and in a backward coming next (the same one: its stage, kind
        and what is prefetched beside it) — each adds non-negative bytes. So an entry that another one matches or exceeds in all of those, with the same
        micro-batches awaiting W on every stage (their bytes are left unsigned here), cannot be
        above it; only distinct, undominated entries are kept. A long schedule repeats or climbs
        through many entries (GPipe at m micro-batches has 2·m, 1F1B's steady state repeats a few),
        and the tuner checks memory for every candidate plan, so this is m/pp times less work on the
        same peak.
        """
        stages = tuple(self.stages_of_rank(rank))
        return [dict(zip(stages, state, strict=True)) for state in
                _undominated(_signature(self.orders[rank], stages, lazy), stages)]

    def in_flight_timeline(self, rank: int) -> list[dict[int, int]]:
        """After each action of ``rank``, the micro-batches per local stage whose activations are
        held: from their ``F`` until their ``B``, or ``W`` under a split backward
        (:meth:`held_timeline`)."""
        return [{s: h.awaiting_input + h.awaiting_weight for s, h in held.items()} for held in self.held_timeline(rank)]

    def in_flight_peak(self) -> list[list[int]]:
        """Peak number of micro-batches whose activations are held, per rank and per local stage.

        Held from ``F`` until ``B``, or ``W`` under a split backward (:meth:`held_timeline`).
        Returns ``peaks[r][j]`` for the j-th stage of ``stages_of_rank(r)``; the per-rank peak of
        the sum over stages is ``rank_in_flight_peak``.
        """
        peaks: list[list[int]] = []
        for r in range(self.pp):
            stages = self.stages_of_rank(r)
            timeline = self.in_flight_timeline(r)
            peaks.append([max((t[s] for t in timeline), default=0) for s in stages])
        return peaks

    def rank_in_flight_peak(self) -> list[int]:
        """Per rank, the peak over time of the held micro-batch activations summed over its stages.

        Counted in units of one stage's activations for one micro-batch; with unequal chunk
        sizes use :meth:`in_flight_timeline` and weight each stage.
        """
        return [max((sum(t.values()) for t in self.in_flight_timeline(r)), default=0) for r in range(self.pp)]


# loop_stage_to_rank and v_stage_to_rank are the plan rules of traces.layout, re-exported for the schedules.
__all__ = ["KINDS", "Action", "Held", "Schedule", "follows_own_forward", "loop_stage_to_rank", "prefetched_backward",
           "v_stage_to_rank"]
