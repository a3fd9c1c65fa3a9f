"""Pipeline schedules as pure functions: (name, pp, m, v) → every rank's ordered compute actions.

One implementation serves the simulator (which times the lists) and the executor (which writes
them as torch compute-only CSV, :mod:`mindpipe.simulator.action_table`, and runs them), DESIGN.md "One
schedule implementation". Orders follow the literature, BACKGROUND.md §1.1:

* ``gpipe`` (Huang et al., arXiv 1811.06965): all forwards, then all backwards.
* ``1f1b`` (PipeDream-Flush; Narayanan et al., SC'21 §2.2.1; Megatron
  ``forward_backward_pipelining_without_interleaving``): warmup min(p−r−1, m) forwards, then
  (F next, B oldest) pairs, then the remaining backwards.
* ``interleaved_1f1b`` (§2.2.2; Megatron ``forward_backward_pipelining_with_interleaving``): v
  chunks per rank in loop placement, warmup (p−r−1)·2 + (v−1)·p, or all m·v when m == p.
* ``zb_h1`` (Qi et al., ICLR'24, "ZB-H1"): 1F1B's F/I skeleton and in-flight cap; rank r defers
  its first r weight passes and then runs the oldest pending W after every I, so the deferred W
  fill the cooldown bubble. Same order as torch's ``ScheduleInterleavedZeroBubble`` with one
  stage per rank (``_get_1f1b_rank_ops(enable_zero_bubble=True)``, ``num_1f1b_microbatches=rank``)
  and Megatron-DeepSpeed's "official" ZB-H1 (uniform B/W split).
* ``zbv`` (Qi et al., §6 "ZB-V"): 2 chunks per rank in a V; torch ``ScheduleZBVZeroBubble``.
* ``dualpipev`` (DeepSeek-V3 DualPipe, "cut-in-half" V variant; deepseek-ai/DualPipe
  ``dualpipev.py``, torch ``ScheduleDualPipeV``): the fused forward+backward chunks
  (``OVERLAP_F_B``) are listed as the forward followed by the full backward, which keeps the
  order's dependencies (a fused pair needs both ready, the split pair only each in turn) but not
  the intra-pair compute/communication overlap.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from mindpipe.simulator.actions import Action, Schedule
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import schedule_stage_to_rank
from mindpipe.traces.schedule_rules import SCHEDULES, microbatch_rule, virtual_stages_rule

# The Plan contract owns the list of schedule names; this module implements each of them.
SCHEDULE_NAMES = SCHEDULES

_Orders = tuple[tuple[Action, ...], ...]


def _gpipe(r: int, p: int, m: int) -> list[Action]:
    return [Action(r, "F", i) for i in range(m)] + [Action(r, "B", i) for i in range(m)]


def _one_f_one_b(r: int, p: int, m: int) -> list[Action]:
    w = min(p - r - 1, m)
    out = [Action(r, "F", i) for i in range(w)]
    for i in range(m - w):
        out += (Action(r, "F", w + i), Action(r, "B", i))
    out += [Action(r, "B", i) for i in range(m - w, m)]
    return out


def _zb_h1(r: int, p: int, m: int) -> list[Action]:
    # Backward k (k = 0..m-1) is an I; after it, once r weight passes are pending, the oldest W
    # runs. The trailing r W fill the tail bubble (Qi et al. Fig. 3; torch num_1f1b_microbatches).
    w = min(p - r - 1, m)
    out = [Action(r, "F", i) for i in range(w)]
    for k in range(m):
        if w + k < m:
            out.append(Action(r, "F", w + k))
        out.append(Action(r, "I", k))
        if k >= r:
            out.append(Action(r, "W", k - r))
    out += [Action(r, "W", k) for k in range(max(0, m - r), m)]
    return out


def _interleaved(r: int, p: int, m: int, v: int) -> list[Action]:
    total = m * v
    # Megatron: all-warmup when m == p, else (p-r-1)*2 + (v-1)*p capped at m*v.
    warm = total if m == p else min((p - r - 1) * 2 + (v - 1) * p, total)

    def fwd(k: int) -> Action:
        chunk = (k // p) % v
        return Action(chunk * p + r, "F", (k // (p * v)) * p + k % p)

    def bwd(k: int) -> Action:
        chunk = v - 1 - (k // p) % v
        return Action(chunk * p + r, "B", (k // (p * v)) * p + k % p)

    out = [fwd(k) for k in range(warm)]
    for k in range(total - warm):
        out += (fwd(warm + k), bwd(k))
    out += [bwd(k) for k in range(total - warm, total)]
    return out


def _zbv(r: int, p: int, m: int) -> list[Action]:
    # Qi et al. §6 hand-crafted ZB-V: chunk 0 is stage r, chunk 1 stage 2p-1-r. The pattern needs
    # at least 2p-1 micro-batches; with fewer, build it for 2p-1 and drop the extra ones, which
    # keeps the relative order (and so the dependencies) of what remains (torch does the same).
    n = max(2 * p - 1, m)
    s0, s1 = r, 2 * p - 1 - r
    out: list[Action] = []
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (p - r) - 1):
        out.append(Action(s0, "F", f0))
        f0 += 1
    for _ in range(r):
        out += (Action(s1, "F", f1), Action(s0, "F", f0))
        f1 += 1
        f0 += 1
    for _ in range(p - r):
        out += (Action(s1, "F", f1), Action(s1, "I", b1), Action(s1, "W", b1))
        f1 += 1
        b1 += 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            out.append(Action(s0, "F", f0))
            f0 += 1
        out += (Action(s0, "I", b0), Action(s0, "W", b0), Action(s1, "F", f1), Action(s1, "I", b1),
                Action(s1, "W", b1))
        f1 += 1
        b0 += 1
        b1 += 1
    w0, w1 = b0, b1
    for _ in range(r):
        out += (Action(s0, "I", b0), Action(s1, "I", b1))
        b0 += 1
        b1 += 1
    for _ in range(p - r):
        out += (Action(s0, "I", b0), Action(s0, "W", w0))
        b0 += 1
        w0 += 1
    out += [Action(s1, "W", i) for i in range(w1, b1)]
    out += [Action(s0, "W", i) for i in range(w0, b0)]
    return [a for a in out if a.microbatch < m]


def _dualpipev(r: int, p: int, m: int) -> list[Action]:
    # DeepSeek's DualPipeV steps 1-8 (deepseek-ai/DualPipe dualpipev.py; torch ScheduleDualPipeV).
    s0, s1 = r, 2 * p - 1 - r
    nxt = {(s0, "F"): 0, (s1, "F"): 0, (s0, "I"): 0, (s1, "I"): 0}  # next micro-batch per stream
    pending_w: list[Action] = []  # weight passes of split backwards, oldest first
    out: list[Action] = []

    def act(stage: int, kind: str) -> None:
        key = (stage, "F" if kind == "F" else "I")  # B and I share the backward counter
        out.append(Action(stage, kind, nxt[key]))
        if kind == "I":
            pending_w.append(Action(stage, "W", nxt[key]))
        nxt[key] += 1

    def weight() -> None:
        if pending_w:
            out.append(pending_w.pop(0))

    for _ in range(2 * (p - r - 1)):  # 1: F0
        act(s0, "F")
    for _ in range(r + 1):  # 2: F0 F1
        act(s0, "F")
        act(s1, "F")
    for _ in range(p - r - 1):  # 3: I1 W F1
        act(s1, "I")
        weight()
        act(s1, "F")
    for _ in range(m - 2 * p + r + 1):  # 4: (F0 & B1) (F1 & B0), each fused pair listed F then B
        act(s0, "F")
        act(s1, "B")
        act(s1, "F")
        act(s0, "B")
    for _ in range(p - r - 1):  # 5: B1 (F1 & B0)
        act(s1, "B")
        act(s1, "F")
        act(s0, "B")
    split = False
    for i in range(r + 1):  # 6: B1 B0, the second half with split backward
        if i == (r + 1) // 2 and r % 2 == 1:
            split = True
        act(s1, "I" if split else "B")
        if i == (r + 1) // 2 and r % 2 == 0:
            split = True
        act(s0, "I" if split else "B")
    for _ in range(p - r - 1):  # 7: W I0
        weight()
        act(s0, "I")
    for _ in range(r + 1):  # 8: W
        weight()
    return out


def _check(name: str, pp: int, m: int, v: int) -> None:
    def fail(key: str, rule: str) -> None:
        raise ContractError("plan", key, rule)

    if name not in SCHEDULE_NAMES:
        fail("schedule", f"schedule={name!r} is not one of {', '.join(SCHEDULE_NAMES)}")
    if pp < 1:
        fail("pp", f"pp={pp} must be >= 1")
    if m < 1:
        fail("num_microbatches", f"num_microbatches={m} must be >= 1")
    if v < 1:
        fail("virtual_stages", f"virtual_stages={v} must be >= 1")
    if (rule := virtual_stages_rule(name, v)) is not None:
        fail("virtual_stages", rule)
    if (rule := microbatch_rule(name, pp, m)) is not None:
        fail("num_microbatches", rule)


_GENERATORS: dict[str, Callable[[int, int, int], list[Action]]] = {
    "gpipe": _gpipe, "1f1b": _one_f_one_b, "zb_h1": _zb_h1, "zbv": _zbv, "dualpipev": _dualpipev,
}


@lru_cache(maxsize=32)
def _orders(name: str, pp: int, m: int, v: int) -> _Orders:
    # Cached: the tuner rebuilds the same schedule many times, and Actions are immutable.
    if name == "interleaved_1f1b":
        rows = [_interleaved(r, pp, m, v) for r in range(pp)]
    else:
        rows = [_GENERATORS[name](r, pp, m) for r in range(pp)]
    return tuple(tuple(row) for row in rows)


def build_schedule(name: str, pp: int, num_microbatches: int, virtual_stages: int = 1) -> Schedule:
    """Every rank's compute order for one iteration of the named schedule.

    Args:
        name: ``gpipe``, ``1f1b``, ``interleaved_1f1b``, ``zb_h1``, ``zbv`` or ``dualpipev``.
        pp: Pipeline ranks.
        num_microbatches: Micro-batches per iteration (m).
        virtual_stages: Model chunks per rank (v): 1 for gpipe/1f1b/zb_h1, 2 for zbv/dualpipev,
            any v >= 1 for interleaved_1f1b (loop placement, stage c·pp + r on rank r).

    Returns:
        A fresh :class:`~mindpipe.simulator.actions.Schedule` (the caller may mutate its lists).

    Raises:
        ContractError: source ``plan``, naming the key and rule (unknown name, pp/m/v < 1, wrong v
            for the schedule, interleaved m not a multiple of pp, dualpipev m < 2·pp).
    """
    _check(name, pp, num_microbatches, virtual_stages)
    n_st = pp * virtual_stages
    placement = schedule_stage_to_rank(name, pp, n_st)
    orders = _orders(name, pp, num_microbatches, virtual_stages)
    return Schedule(name, pp, num_microbatches, n_st, placement, [list(o) for o in orders])


_Key = tuple[int, str, int]


def _deps(a: Action, last_stage: int) -> list[_Key]:
    """(stage, kind, micro-batch) that must finish before ``a`` (BACKGROUND.md §1.3); backward as I."""
    s, mb = a.stage, a.microbatch
    if a.kind == "F":
        return [(s - 1, "F", mb)] if s > 0 else []
    if a.kind == "W":
        return [(s, "I", mb)]
    return [(s, "F", mb), (s + 1, "I", mb)] if s < last_stage else [(s, "F", mb)]


def validate_schedule(s: Schedule) -> None:
    """Check that ``s`` is complete, well placed and runs to the end without deadlock.

    Every (stage, micro-batch) needs exactly one F and either one B or one I and one W, on the
    rank that holds the stage. Dependencies: F(s,μ) needs F(s−1,μ); B/I(s,μ) needs F(s,μ) and
    B/I(s+1,μ) (the last stage only its own F); W(s,μ) needs I(s,μ). The replay runs each rank's
    list in order, an action as soon as its dependencies are done.

    Raises:
        ValueError: naming the rank and action at fault (and, for a deadlock, what each stuck
            rank waits for).
    """
    m, n_st = s.num_microbatches, s.num_stages
    if len(s.stage_to_rank) != n_st or any(not 0 <= r < s.pp for r in s.stage_to_rank):
        raise ValueError(f"schedule {s.name}: stage_to_rank {s.stage_to_rank} does not map {n_st} stages to {s.pp} ranks")
    if len(s.orders) != s.pp:
        raise ValueError(f"schedule {s.name}: {len(s.orders)} rank orders for pp={s.pp}")
    seen: dict[tuple[int, str, int], int] = {}
    for r, order in enumerate(s.orders):
        for a in order:
            if a.stage >= n_st or a.microbatch >= m:
                raise ValueError(f"schedule {s.name}: rank {r} runs {a} outside {n_st} stages × {m} micro-batches")
            if s.stage_to_rank[a.stage] != r:
                raise ValueError(f"schedule {s.name}: rank {r} runs {a} but stage {a.stage} is on rank "
                                 f"{s.stage_to_rank[a.stage]}")
            key = (a.stage, a.kind, a.microbatch)
            if key in seen:
                raise ValueError(f"schedule {s.name}: rank {r} runs {a} twice")
            seen[key] = r
    for st in range(n_st):
        for mb in range(m):
            has = {k for k in "FBIW" if (st, k, mb) in seen}
            if "F" not in has or not (has == {"F", "B"} or has == {"F", "I", "W"}):
                raise ValueError(f"schedule {s.name}: stage {st} micro-batch {mb} on rank {s.stage_to_rank[st]} has "
                                 f"{''.join(sorted(has)) or 'nothing'}; needs F and either B or I and W")
    _replay(s)


def _replay(s: Schedule) -> None:
    done: set[_Key] = set()  # backward actions are recorded as I, whichever kind ran
    pos = [0] * s.pp
    last = s.num_stages - 1
    progress = True
    while progress:
        progress = False
        for r, order in enumerate(s.orders):
            i = start = pos[r]
            while i < len(order):
                a = order[i]
                if not all(d in done for d in _deps(a, last)):
                    break
                done.add((a.stage, "I" if a.kind == "B" else a.kind, a.microbatch))
                i += 1
            if i != start:
                pos[r] = i
                progress = True
    stuck = [r for r in range(s.pp) if pos[r] < len(s.orders[r])]
    if stuck:
        parts = []
        for r in stuck:
            a = s.orders[r][pos[r]]
            waits = ", ".join(f"{'B/I' if k == 'I' and a.kind != 'W' else k}({st},{mb}) on rank {s.stage_to_rank[st]}"
                              for st, k, mb in _deps(a, last) if (st, k, mb) not in done)
            parts.append(f"rank {r} is stuck at {a} (position {pos[r]}), waiting for {waits}")
        raise ValueError(f"schedule {s.name}: deadlock: " + "; ".join(parts))


__all__ = ["SCHEDULE_NAMES", "build_schedule", "validate_schedule"]


def schedule_rule(name: str, pp: int, num_microbatches: int, virtual_stages: int = 1) -> str | None:
    """The rule :func:`build_schedule` would reject these arguments with, or None when it accepts them.

    The same argument check, without building the action lists: the tuner asks it for every
    combination of its search space, so the two cannot disagree on which schedules are valid.
    """
    try:
        _check(name, pp, num_microbatches, virtual_stages)
    except ContractError as e:
        return e.rule
    return None


__all__ += ["schedule_rule"]
