"""Supernet schedules as pure functions: NASPipe's causal synchronous parallel and its baselines.

Each of N subnets trains one micro-batch, in subnet (causal) order 0..N−1 (BACKGROUND.md §5). A
schedule returns, for every pipeline stage, the ordered ``F``/``B`` actions of every subnet
(:class:`~mindpipe.simulator.actions.Action` with the subnet index as micro-batch), plus when the
stage applies weight updates. The simulator times these lists and the executor runs the same
lists (DESIGN.md "One schedule implementation"):

* ``sequential``: one subnet at a time through the whole pipeline (F0 B0 F1 B1 … on every stage);
  each subnet's update before the next subnet starts. The reference semantics.
* ``csp`` (NASPipe's causal synchronous parallel): stage s runs subnet b's forward only when every
  earlier subnet w < b that shares an operator with b on s (:func:`~mindpipe.traces.supernet.stage_operators`)
  has finished its backward — and so its update — on s, and b is within the look-ahead ``window``
  of the oldest subnet not yet updated on s. Each stage applies subnet b's update right after
  B(b). Every operator's parameters then see the updates in subnet order, so training is
  bit-identical to ``sequential`` whatever the interleaving.
* ``sync``: GPipe-style 1F1B over the ``batch`` subnets of each batch, all reading the weights of
  the batch's start; the stage applies the batch's accumulated updates after its last backward
  (not equivalent to sequential training).
* ``async``: PipeDream-style 1F1B over all N subnets without flushes; each update right after its
  backward, with no conflict check (reproducible only in its own order, not sequential's).

The CSP order is produced by list-scheduling the rule on nominal durations (forward 1, backward 2
per stage, or the ``durations`` given): a stage that is free runs the oldest arrived backward,
else the oldest arrived forward the rule allows. The per-stage order that results is feasible for
any real durations (it is one topological order of the dependency graph), so the executor can run
it with blocking transfers and the simulator can time it with costed actions.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from mindpipe.simulator.actions import Action, Schedule
from mindpipe.simulator.schedules import build_schedule, validate_schedule
from mindpipe.traces.config import SUBNET_SCHEDULES
from mindpipe.traces.errors import ContractError

UpdateRule = Literal["each_backward", "batch_end"]
StageOps = Sequence[Sequence[frozenset[tuple[int, int]]]]
"""``ops[b][s]``: the operators subnet b uses on stage s (:func:`~mindpipe.traces.supernet.stage_operators`)."""
Durations = Callable[[str, int, int], float]
"""``durations(kind, stage, subnet)``: nominal seconds of an ``F`` or ``B`` action, for ordering only."""


@dataclass(frozen=True)
class SubnetSchedule:
    """Per-stage ordered actions of a supernet run and when updates are applied.

    Attributes:
        name: ``csp``, ``sequential``, ``sync`` or ``async``.
        num_stages: Pipeline stages (one per rank).
        num_subnets: Subnets trained, N.
        orders: ``orders[s]``: stage s's ``F``/``B`` actions in execution order.
        update: ``each_backward`` (the subnet's update right after its B on a stage) or
            ``batch_end`` (``sync``: after the last B of each batch of ``batch`` subnets).
        batch: Subnets per batch (``sync``), else 1.
        window: Look-ahead window (``csp``), else 1.
    """

    name: str
    num_stages: int
    num_subnets: int
    orders: tuple[tuple[Action, ...], ...]
    update: UpdateRule
    batch: int = 1
    window: int = 1

    def as_schedule(self) -> Schedule:
        """The orders as a pipeline :class:`~mindpipe.simulator.actions.Schedule` (one stage per rank)."""
        return Schedule(self.name, self.num_stages, self.num_subnets, self.num_stages,
                        list(range(self.num_stages)), [list(o) for o in self.orders])

    def in_flight_peak(self) -> list[int]:
        """Per stage, the most subnets whose activations are held at once (F done, B not yet)."""
        return self.as_schedule().rank_in_flight_peak()


def _nominal(kind: str, stage: int, subnet: int) -> float:
    return 1.0 if kind == "F" else 2.0


def _check(name: str, num_stages: int, num_subnets: int, window: int, batch: int) -> None:
    if name not in SUBNET_SCHEDULES:
        raise ContractError("", "subnet_schedule", f"subnet_schedule={name!r} is not one of {', '.join(SUBNET_SCHEDULES)}")
    for key, value in (("pp", num_stages), ("subnets", num_subnets), ("subnet_window", window), ("batch", batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ContractError("", key, f"{key}={value!r} must be an integer >= 1")
    if name == "sync" and num_subnets % batch:
        raise ContractError("", "batch", f"sync needs the subnets ({num_subnets}) to be a multiple of batch={batch}")


def _csp_orders(ops: StageOps, num_stages: int, window: int, durations: Durations) -> list[list[Action]]:
    """List-schedule CSP's rule on ``durations``; returns every stage's order."""
    n = len(ops)
    orders: list[list[Action]] = [[] for _ in range(num_stages)]
    arrived_f = [set(range(n)) if s == 0 else set() for s in range(num_stages)]  # forwards received
    arrived_b: list[list[int]] = [[] for _ in range(num_stages)]  # backwards received (heap)
    updated = [[False] * n for _ in range(num_stages)]
    oldest = [0] * num_stages  # oldest subnet not yet updated on the stage
    busy_until = [0.0] * num_stages
    events: list[tuple[float, int, int, str, int]] = []  # (time, seq, stage, kind, subnet) completions
    seq = 0

    def allowed(s: int, b: int) -> bool:
        mine = ops[b][s]
        return all(updated[s][w] or not (ops[w][s] & mine) for w in range(oldest[s], b))

    def start(s: int, now: float) -> None:
        nonlocal seq
        if arrived_b[s]:
            b, kind = heapq.heappop(arrived_b[s]), "B"
        else:
            look = range(oldest[s], min(n, oldest[s] + window))
            pick = next((b for b in look if b in arrived_f[s] and allowed(s, b)), None)
            if pick is None:
                return
            arrived_f[s].discard(pick)
            b, kind = pick, "F"
        orders[s].append(Action(s, kind, b))
        busy_until[s] = now + durations(kind, s, b)
        heapq.heappush(events, (busy_until[s], seq, s, kind, b))
        seq += 1

    start(0, 0.0)
    now = 0.0
    while events:
        now, _, s, kind, b = heapq.heappop(events)
        touched = {s}
        if kind == "F":
            if s + 1 < num_stages:
                arrived_f[s + 1].add(b)
                touched.add(s + 1)
            else:
                heapq.heappush(arrived_b[s], b)
        else:
            updated[s][b] = True
            while oldest[s] < n and updated[s][oldest[s]]:
                oldest[s] += 1
            if s > 0:
                heapq.heappush(arrived_b[s - 1], b)
                touched.add(s - 1)
        for t in sorted(touched):
            if busy_until[t] <= now and not any(e[2] == t for e in events):
                start(t, now)
    if any(len(o) != 2 * n for o in orders):  # the rule always lets the oldest subnet run, so this is a bug
        raise RuntimeError("csp: list scheduling stopped before every subnet finished")
    return orders


def build_subnet_schedule(name: str, ops: StageOps, num_stages: int, window: int = 1, batch: int = 1,
                          durations: Durations | None = None) -> SubnetSchedule:
    """Every stage's ordered actions for training the subnets of ``ops`` in order.

    Args:
        name: ``csp``, ``sequential``, ``sync`` or ``async``.
        ops: ``ops[b][s]``, the operators subnet b uses on stage s (only ``csp`` reads them).
        num_stages: Pipeline stages.
        window: CSP look-ahead: a stage starts subnet b only if b < (oldest subnet not yet updated
            on it) + window, so at most ``window`` subnets are in flight on a stage.
        batch: Subnets per synchronous batch (``sync``).
        durations: Nominal action durations used to order CSP (default forward 1, backward 2).

    Raises:
        ContractError: an unknown name, a count below 1, or subnets not a multiple of ``batch``.
    """
    n = len(ops)
    _check(name, num_stages, n, window, batch)
    if any(len(per) != num_stages for per in ops):
        raise ContractError("", "ops", f"every subnet needs operators for each of the {num_stages} stages")
    update: UpdateRule = "each_backward"
    if name == "sequential":
        orders = [[Action(s, k, b) for b in range(n) for k in ("F", "B")] for s in range(num_stages)]
    elif name == "csp":
        orders = _csp_orders(ops, num_stages, window, durations or _nominal)
    elif name == "async":
        orders = [list(o) for o in build_schedule("1f1b", num_stages, max(n, num_stages)).orders]
        orders = [[a for a in o if a.microbatch < n] for o in orders]
    else:
        update = "batch_end"
        per = build_schedule("1f1b", num_stages, max(batch, num_stages)).orders if batch >= num_stages else \
            build_schedule("gpipe", num_stages, batch).orders
        orders = [[Action(s, a.kind, start + a.microbatch) for start in range(0, n, batch) for a in per[s]]
                  for s in range(num_stages)]
    out = SubnetSchedule(name, num_stages, n, tuple(tuple(o) for o in orders), update,
                         batch if name == "sync" else 1, window if name == "csp" else 1)
    validate_schedule(out.as_schedule())
    return out


def csp_violations(schedule: SubnetSchedule, ops: StageOps) -> list[str]:
    """Where a stage's order breaks CSP's rule: ``F(b)`` before ``B(w)`` of an earlier subnet sharing an operator.

    Empty for every ``csp`` and ``sequential`` schedule; the executor checks a table with it before running.
    """
    out: list[str] = []
    for s, order in enumerate(schedule.orders):
        done: set[int] = set()
        oldest = 0  # every subnet below it has run its backward on s
        for a in order:
            if a.kind == "B":
                done.add(a.microbatch)
                while oldest in done:
                    oldest += 1
                continue
            b = a.microbatch
            clash = next((w for w in range(oldest, b) if w not in done and ops[w][s] & ops[b][s]), None)
            if clash is not None:
                out.append(f"stage {s}: F{b} runs before B{clash}, which shares an operator")
    return out


def consecutive_conflict_rate(ops: StageOps, stage: int) -> float:
    """Fraction of consecutive subnet pairs (b, b+1) that share an operator on ``stage``."""
    pairs = len(ops) - 1
    if pairs < 1:
        return 0.0
    return sum(1 for b in range(pairs) if ops[b][stage] & ops[b + 1][stage]) / pairs


__all__ = [
    "SUBNET_SCHEDULES",
    "Durations",
    "StageOps",
    "SubnetSchedule",
    "UpdateRule",
    "build_subnet_schedule",
    "consecutive_conflict_rate",
    "csp_violations",
]
