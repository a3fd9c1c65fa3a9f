"""Per-action SM clocks (Perseus's per-instruction plan) and an upper bound on what any clock plan saves.

Perseus (SOSP'24) gives every forward and backward of every micro-batch its own clock; the plan
key is ``action_clocks_mhz`` (the executor switches it around every action:
:class:`mindpipe.executor.clocks.ActionClocks`). Both
functions work on the nodes of :class:`~mindpipe.tuner.clock_dag.ClockDag` (the schedule's
actions, program order per rank, activation/gradient edges with their send times).

**Effective energy.** A rank that is not computing draws the blocked power P_blk (Perseus's
accounting), so an iteration of length T costs P_blk·T per device plus, per action,
e′ = (P(f) − P_blk)·c(f) (c: its compute seconds at clock f; tensor-parallel collectives draw
P_blk at any clock). Lowering a clock pays when it lowers e′; each (stage, phase) has a floor, the
highest clock with the least e′ (below it e′ no longer falls: the voltage floor of
:mod:`mindpipe.simulator.frequency`).

**Planner** (:func:`absorb_slack`): not Perseus's Phillips–Dessouky min-cut but a slack-filling
pass on the same DAG, with a feasibility proof instead of an optimality one. Each round computes
every node's earliest start at the current clocks, then walks the nodes backwards computing
latest finishes against the deadline; a node is lowered by one clock step when it still ends by
its latest finish when started at its earliest start. By induction over the topological order every
node of the new plan then ends by its latest finish, so the span stays within the deadline.
One step per node per round spreads the slack over many actions (e′ is convex in the clock
near f_max, so two small slow-downs save more than one large one). Rounds repeat until nothing moves.

**Exact** (:func:`lp_plan`): the same problem with each action's options relaxed to their
convex hull is the classical time–cost trade-off LP, which Perseus's min-cuts solve step by
step; HiGHS solves it whole. Its optimum bounds every plan, and its rounding is a plan.

**Bound** (:func:`energy_bound`): relax the DAG to one constraint per rank — its actions must fit
between its earliest possible first start and its latest possible last finish, both at f_max
(slower clocks only delay starts and shorten what is left after the last action) — and solve the
relaxed problem exactly (a continuous knapsack over each action type's lower convex hull of
(duration, e′)). No clock plan, per stage or per action, within the deadline saves more on the
DAG's energy model.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from mindpipe.tuner.clock_dag import ClockDag

_EPS = 1e-12


@dataclass
class ActionGrid:
    """Per node and clock-grid index: duration and effective energy (module docstring).

    Attributes:
        dag: The iteration DAG.
        grid: Clocks, descending from f_max.
        nodes: ``dag.topo()``.
        phase: Per node, 0 for a forward, 1 for a backward part (B, I or W).
        dur: Per node, seconds at each grid index (compute stretched + TP collectives alone).
        eff: Per node, effective energy e′ in joules per device at each grid index.
        floor: Per node, the highest-index (slowest) clock worth running: least e′, ties to the faster.
        rank_next: Per node, the next node on its rank (−1 at the end).
        succ: Per node, its data successors and the send between them.
        after: Per rank, seconds of the data-parallel wrapper's copies after its last node
            (:attr:`~mindpipe.tuner.clock_dag.ClockDag.after_s`): its last node ends that much
            before the span. Copies inside a node are in its ``dur`` and ``eff``; those after the rank's
            last node draw their e′ in the stage's last gradient node, at its clock.
    """

    dag: ClockDag
    grid: list[int]
    nodes: list[tuple[int, int, int, int, float, int]]
    phase: list[int]
    dur: list[list[float]]
    eff: list[list[float]]
    floor: list[int]
    rank_next: list[int]
    succ: list[list[tuple[int, float]]]
    after: list[float]

    @classmethod
    def of(cls, dag: ClockDag, grid: Sequence[int]) -> ActionGrid:
        """Tabulate ``dag``'s nodes over ``grid`` (descending clocks, f_max first)."""
        grid = list(grid)
        nodes = dag.topo()
        p_blk = dag.power.blocked_power_W
        # Per (stage, code): compute seconds at f_max and TP seconds; code 0 F, 1 B, 2 I, 3 W.
        base = {0: dag.compute_f, 1: [i + w for i, w in zip(dag.compute_i, dag.compute_w, strict=True)],
                2: dag.compute_i, 3: dag.compute_w}
        tp = {0: dag.tp_f, 1: dag.tp_b, 2: dag.tp_b, 3: [0.0] * len(dag.tp_b)}
        cache: dict[tuple[int, int], tuple[list[float], list[float], int]] = {}
        phase, dur, eff, floor = [], [], [], []
        last_grad = {s: n for n, (_, s, code, _, _, _) in enumerate(nodes) if code in (1, 3)}
        copy_power = [dag.power.busy_power_w(mhz, 0.0) - p_blk for mhz in grid]
        for n, (_, s, code, _, _, mb) in enumerate(nodes):
            k = 0 if code == 0 else 1
            if (s, code) not in cache:
                d_row, e_row = [], []
                for mhz in grid:
                    ph = dag.table.at(s, mhz)[k]
                    c = base[code][s] * ph.stretch
                    d_row.append(c + tp[code][s])
                    e_row.append((dag.power.phase_power_w(mhz, ph) - p_blk) * c)
                least = min(e_row)
                best = next(j for j, v in enumerate(e_row) if v <= least + 1e-9 * abs(least))
                cache[(s, code)] = (d_row, e_row, best)
            d_row, e_row, best = cache[(s, code)]
            inside = dag.node_copy_s(s, code, mb)
            copied = inside + (dag.copies.after[s][0] if last_grad.get(s) == n else 0.0)
            if copied > 0.0:  # memory-bound copies: unstretched, at memory-bound power
                d_row = [d + inside for d in d_row]
                e_row = [e + p * copied for e, p in zip(e_row, copy_power, strict=True)]
                least = min(e_row)
                best = next(j for j, v in enumerate(e_row) if v <= least + 1e-9 * abs(least))
            phase.append(k)
            dur.append(d_row)
            eff.append(e_row)
            floor.append(best)
        rank_next = [-1] * len(nodes)
        last: dict[int, int] = {}
        succ: list[list[tuple[int, float]]] = [[] for _ in nodes]
        for n, (r, _, _, pred, send, _) in enumerate(nodes):
            if r in last:
                rank_next[last[r]] = n
            last[r] = n
            if pred >= 0:
                succ[pred].append((n, send))
        return cls(dag, grid, nodes, phase, dur, eff, floor, rank_next, succ, list(dag.after_s))

    def index_of(self, rank_clocks: Sequence[int]) -> list[int]:
        """Per node, the grid index of its rank's clock (a per-stage plan as a per-action one)."""
        where = {mhz: j for j, mhz in enumerate(self.grid)}
        return [where[rank_clocks[r]] for r, *_ in self.nodes]

    def starts(self, idx: Sequence[int]) -> tuple[list[float], float]:
        """Earliest starts of every node at clock indices ``idx`` and the span (list scheduling)."""
        free = [0.0] * self.dag.pp
        start = [0.0] * len(self.nodes)
        end = [0.0] * len(self.nodes)
        for n, (r, _, _, pred, send, _) in enumerate(self.nodes):
            t = free[r]
            if pred >= 0 and end[pred] + send > t:
                t = end[pred] + send
            start[n] = t
            end[n] = free[r] = t + self.dur[n][idx[n]]
        return start, max(f + a for f, a in zip(free, self.after, strict=True))

    def energy(self, idx: Sequence[int], span_s: float) -> float:
        """DAG energy of all devices: P_blk × iteration + Σ e′ per rank (module docstring)."""
        t = span_s + self.dag.tail_s
        e = sum(self.eff[n][idx[n]] for n in range(len(self.nodes)))
        return (self.dag.power.blocked_power_W * t * self.dag.pp + e) * self.dag.devices_per_rank

    def action_clocks(self, idx: Sequence[int]) -> list[list[list[int]]]:
        """``action_clocks_mhz`` of ``idx``: a backward split into I and W runs at the faster of the two."""
        n_st, m = len(self.dag.compute_f), self.dag.num_microbatches
        low = [[[len(self.grid)] * m, [len(self.grid)] * m] for _ in range(n_st)]
        for n, (_, s, _, _, _, mb) in enumerate(self.nodes):
            k = self.phase[n]
            low[s][k][mb] = min(low[s][k][mb], idx[n])
        return [[[self.grid[min(j, len(self.grid) - 1)] for j in row] for row in pair] for pair in low]


def absorb_slack(ag: ActionGrid, idx: Sequence[int], deadline_span_s: float, max_rounds: int = 1000) -> list[int]:
    """Lower action clocks into the DAG's slack without the span passing ``deadline_span_s`` (module docstring).

    ``idx`` (per node grid indices) must already meet the deadline; it is the starting plan.
    """
    idx = list(idx)
    n_nodes = len(ag.nodes)
    level = min(idx)
    for _ in range(max_rounds):
        start, span = ag.starts(idx)
        if span > deadline_span_s * (1 + 1e-12):
            raise ValueError(f"the starting plan's span {span:.6g} s exceeds the deadline {deadline_span_s:.6g} s")
        latest = [0.0] * n_nodes  # latest start
        moved = False
        for n in range(n_nodes - 1, -1, -1):
            lf = deadline_span_s - ag.after[ag.nodes[n][0]]
            nx = ag.rank_next[n]
            if nx >= 0 and latest[nx] < lf:
                lf = latest[nx]
            for sc, send in ag.succ[n]:
                if latest[sc] - send < lf:
                    lf = latest[sc] - send
            j = idx[n]
            if j <= level and j < ag.floor[n] and start[n] + ag.dur[n][j + 1] <= lf + _EPS:
                j = idx[n] = j + 1
                moved = True
            latest[n] = lf - ag.dur[n][j]
        if not moved:
            if level >= max(ag.floor):
                break
            level += 1
    return idx


def energy_bound(ag: ActionGrid, limit_s: float) -> tuple[float, float]:
    """Lower bounds on the DAG energy of any clock plan whose iteration is at most ``limit_s``.

    Returns:
        (rank-window bound, free-time bound): the first relaxes the DAG to one time window per rank
        (module docstring); the second lets every action run at its floor at no cost in time
        (what the energy curve alone allows). Both charge the blocked power over the fastest
        iteration (all clocks at f_max), which no plan undercuts.
    """
    deadline = limit_s - ag.dag.tail_s
    fast = [0] * len(ag.nodes)
    start, fast_span = ag.starts(fast)
    latest = [0.0] * len(ag.nodes)
    for n in range(len(ag.nodes) - 1, -1, -1):
        lf = deadline - ag.after[ag.nodes[n][0]]
        nx = ag.rank_next[n]
        if nx >= 0:
            lf = min(lf, latest[nx])
        for sc, send in ag.succ[n]:
            lf = min(lf, latest[sc] - send)
        latest[n] = lf - ag.dur[n][0]
    per_rank: dict[int, list[int]] = {}
    for n, (r, *_) in enumerate(ag.nodes):
        per_rank.setdefault(r, []).append(n)
    p_blk = ag.dag.power.blocked_power_W
    # No plan is faster than all clocks at f_max: the blocked power is owed at least that long.
    window_e = free_e = p_blk * (fast_span + ag.dag.tail_s) * ag.dag.pp
    for nodes in per_rank.values():
        first, last = nodes[0], nodes[-1]
        window = latest[last] + ag.dur[last][0] - start[first]
        spare = window - sum(ag.dur[n][0] for n in nodes)
        e = sum(ag.eff[n][0] for n in nodes)
        free_e += sum(ag.eff[n][ag.floor[n]] for n in nodes)
        # Segments of each node's lower convex hull of (duration, e′): (slope J/s, seconds).
        segments: list[tuple[float, float]] = []
        for n in nodes:
            segments += _hull_segments(ag.dur[n][: ag.floor[n] + 1], ag.eff[n][: ag.floor[n] + 1])
        segments.sort()
        for slope, seconds in segments:
            if spare <= 0 or slope >= 0:
                break
            take = min(seconds, spare)
            e += slope * take
            spare -= take
        window_e += e
    k = ag.dag.devices_per_rank
    return window_e * k, free_e * k


def _hull_segments(d: Sequence[float], e: Sequence[float]) -> list[tuple[float, float]]:
    """Lower convex hull of points (d[j], e[j]) (d ascending with j) from j = 0, as (slope, length) pieces."""
    hull: list[int] = [0]
    for j in range(1, len(d)):
        if d[j] <= d[hull[-1]] + _EPS:
            if e[j] < e[hull[-1]]:
                hull[-1] = j
            continue
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b lies on or above the chord a→j: drop it.
            if (e[b] - e[a]) * (d[j] - d[a]) >= (e[j] - e[a]) * (d[b] - d[a]):
                hull.pop()
            else:
                break
        hull.append(j)
    return [((e[b] - e[a]) / (d[b] - d[a]), d[b] - d[a]) for a, b in itertools.pairwise(hull)]





def lp_plan(ag: ActionGrid, deadline_span_s: float) -> tuple[list[int], float] | None:
    """The exact least-energy per-action plan of the convexified problem, and a feasible rounding of it.

    The time–cost trade-off LP (Fulkerson 1961; Perseus's Phillips–Dessouky min-cuts walk the same
    problem's frontier): per node a start time and its duration on the lower convex hull of its
    (duration, e′) options, and the span T, subject to rank order, data edges with their sends,
    every node ending by T and T by the deadline; minimise the DAG energy P_blk·(T + tail)·pp + Σ e′.
    Its optimum lower-bounds the DAG energy of every clock plan (per stage or per action) meeting
    the deadline (the hull relaxes the clock grid). Rounding each node to its least-e′ option no
    longer than its LP duration keeps the deadline (shorter nodes never delay others).

    Returns:
        (per-node grid indices of the rounded plan, the LP optimum: DAG energy of all devices) or
        None when the solver fails.
    """
    import numpy as np
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    n_nodes = len(ag.nodes)
    seg_of: list[list[tuple[int, float, float]]] = []  # per node: (variable, slope, length)
    p_blk, pp = ag.dag.power.blocked_power_W, ag.dag.pp
    span = n_nodes  # variables: start times, the span, then hull segments
    cost: list[float] = [0.0] * n_nodes + [p_blk * pp]
    upper: list[float | None] = [None] * n_nodes + [deadline_span_s]
    for n in range(n_nodes):
        segs = []
        for slope, length in _hull_segments(ag.dur[n][: ag.floor[n] + 1], ag.eff[n][: ag.floor[n] + 1]):
            segs.append((len(cost), slope, length))
            cost.append(slope)
            upper.append(length)
        seg_of.append(segs)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    rhs: list[float] = []

    def edge(a: int, b: int, gap: float) -> None:
        """start[a] + duration[a] + gap <= start[b] (b = −1: the span)."""
        r = len(rhs)
        terms = [(a, 1.0), (b if b >= 0 else span, -1.0)] + [(var, 1.0) for var, _, _ in seg_of[a]]
        for col, v in terms:
            rows.append(r)
            cols.append(col)
            vals.append(v)
        rhs.append(-ag.dur[a][0] - gap)

    for n in range(n_nodes):
        if ag.rank_next[n] >= 0:
            edge(n, ag.rank_next[n], 0.0)
        else:
            edge(n, -1, ag.after[ag.nodes[n][0]])
        for sc, send in ag.succ[n]:
            edge(n, sc, send)
    a_ub = coo_matrix((vals, (rows, cols)), shape=(len(rhs), len(cost))).tocsr()
    res = linprog(np.array(cost), A_ub=a_ub, b_ub=np.array(rhs), bounds=[(0.0, u) for u in upper], method="highs")
    if res.status != 0:
        return None
    x = res.x
    idx = []
    for n in range(n_nodes):
        d = ag.dur[n][0] + sum(x[var] for var, _, _ in seg_of[n])
        fits = [j for j in range(ag.floor[n] + 1) if ag.dur[n][j] <= d + 1e-9]
        idx.append(min(fits, key=lambda j: (ag.eff[n][j], j)))
    fixed = sum(ag.eff[n][0] for n in range(n_nodes)) + p_blk * pp * ag.dag.tail_s
    return idx, (fixed + float(res.fun)) * ag.dag.devices_per_rank
__all__ = ["ActionGrid", "absorb_slack", "energy_bound", "lp_plan"]
