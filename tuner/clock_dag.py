"""A fast pipeline DAG of one iteration at given per-rank SM clocks (what the clock planners search on).

The planners of :mod:`mindpipe.tuner.frequency` try thousands of clock assignments; the simpy
engine costs ~0.1 s per 175B iteration, so they price candidates on this DAG instead and the
chosen plans are re-simulated by :meth:`~mindpipe.simulator.simulator.Simulator.run` (the figures
they report). Nodes are the schedule's actions (the same per-rank orders the engine replays);
edges are program order on a rank and the engine's data dependencies — F(s, μ) after F(s−1, μ) plus
the activation send, B/I(s, μ) after B/I(s+1, μ) plus the gradient send (Perseus's 1F1B DAG,
SOSP'24 §4). A node lasts its compute stretched to the rank's clock
(:mod:`mindpipe.simulator.frequency`) plus its tensor-parallel collectives alone; sends take their
time alone. The data-parallel wrapper's copies (FSDP2's, :class:`~mindpipe.simulator.work.StepCopies`)
lengthen the nodes that hold them and their rank's end, unstretched (memory-bound), drawing
memory-bound power at the node's clock. Contention and data-parallel reduction are not modelled:
the constant ``tail_s`` (engine iteration time − DAG span at default clocks) carries what the DAG misses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from mindpipe.simulator.actions import Action
from mindpipe.simulator.frequency import PowerModel, StageClockTable
from mindpipe.simulator.network import Transfers
from mindpipe.simulator.simulator import Simulator
from mindpipe.simulator.work import StepCopies
from mindpipe.traces.config import Plan


@dataclass(frozen=True)
class DagPoint:
    """Iteration time and GPU energy of one clock assignment (one entry per pipeline rank)."""

    rank_clocks_mhz: tuple[int, ...]
    iteration_s: float
    energy_j: float


@dataclass
class ClockDag:
    """The iteration DAG of one plan with per-stage compute at f_max (module docstring)."""

    orders: list[list[Action]]
    stage_to_rank: list[int]
    num_microbatches: int
    compute_f: list[float]
    compute_i: list[float]  # recompute + input gradient
    compute_w: list[float]
    tp_f: list[float]
    tp_b: list[float]
    send_f: list[float]
    send_b: list[float]
    table: StageClockTable
    power: PowerModel
    devices_per_rank: int
    copies: StepCopies
    tail_s: float = 0.0
    _order: list[tuple[int, int, int, int, float, int]] | None = field(default=None, init=False, repr=False)

    @classmethod
    def of(cls, sim: Simulator, plan: Plan, clocks: Sequence[int]) -> ClockDag:
        """The DAG of ``plan`` on ``sim`` with a clock table covering ``clocks``; ``tail_s`` set by
        one engine run at default clocks."""
        if sim.power is None:
            raise ValueError(f"{sim.device.name} has no frequency data")
        schedule, topo, stages, _, _ = sim.work(plan)
        tr = Transfers(None, None, topo, sim.comm)  # type: ignore[arg-type]

        def alone(phases: list | None) -> float:
            return tr.time_alone(phases) if phases else 0.0

        dag = cls(
            orders=[list(o) for o in schedule.orders], stage_to_rank=list(schedule.stage_to_rank),
            num_microbatches=schedule.num_microbatches,
            compute_f=[st.forward_s for st in stages], compute_i=[st.recompute_s + st.input_s for st in stages],
            compute_w=[st.weight_action_s for st in stages], tp_f=[alone(st.fwd_tp) for st in stages],
            tp_b=[alone(st.bwd_tp) for st in stages], send_f=[alone(st.send_fwd) for st in stages],
            send_b=[alone(st.send_bwd) for st in stages], table=sim.clock_table(plan, set(clocks)), power=sim.power,
            devices_per_rank=plan.grad_replicas * plan.tp,
            copies=StepCopies.of(stages, schedule.orders, plan.overlap_grad_reduce))
        default = dag.power.spec.default_sm_clock_MHz
        span = dag.span([default] * plan.pp)[0]
        dag.tail_s = max(0.0, sim.run(dataclasses.replace(plan, stage_clocks_mhz=None)).iteration_time_s - span)
        return dag

    @property
    def pp(self) -> int:
        """Pipeline ranks."""
        return len(self.orders)

    @cached_property
    def after_s(self) -> list[float]:
        """Per rank, the copy seconds after its last node (:attr:`StepCopies.after` summed over the
        rank's stages; summed once, read on every span)."""
        out = [0.0] * self.pp
        for s, (t, _) in enumerate(self.copies.after):
            out[self.stage_to_rank[s]] += t
        return out

    def _durations(self, rank_clocks: Sequence[int]) -> tuple[list[float], list[float], list[float], list[float]]:
        """Per stage: F, I (or B's input part), W node durations and compute seconds of one micro-batch."""
        f_d, i_d, w_d, comp = [], [], [], []
        for s in range(len(self.compute_f)):
            fwd, bwd = self.table.at(s, rank_clocks[self.stage_to_rank[s]])
            cf, ci, cw = self.compute_f[s] * fwd.stretch, self.compute_i[s] * bwd.stretch, self.compute_w[s] * bwd.stretch
            f_d.append(cf + self.tp_f[s])
            i_d.append(ci + self.tp_b[s])
            w_d.append(cw)
            comp.append(cf + ci + cw)
        return f_d, i_d, w_d, comp

    def node_copy_s(self, s: int, code: int, mb: int) -> float:
        """Copy seconds inside the node of stage ``s``, kind ``code`` (0 F, 1 B, 2 I, 3 W), micro-batch ``mb``."""
        return self.copies.in_action.get(("FBIW"[code], s, mb), 0.0)

    def topo(self) -> list[tuple[int, int, int, int, float, int]]:
        """Nodes in a dependency-respecting order: (rank, stage, kind code, predecessor node or −1,
        send seconds, micro-batch).

        Kind codes: 0 F, 1 B (input + weight), 2 I, 3 W. The order depends only on the schedule,
        not on durations, so it is computed once.
        """
        if self._order is not None:
            return self._order
        n_st = len(self.compute_f)
        index: dict[tuple[str, int, int], int] = {}
        out: list[tuple[int, int, int, int, float, int]] = []
        ptr = [0] * self.pp
        left = sum(len(o) for o in self.orders)
        while left:
            progressed = False
            for r, order in enumerate(self.orders):
                while ptr[r] < len(order):
                    a = order[ptr[r]]
                    s, mb, kind = a.stage, a.microbatch, a.kind
                    pred, send = -1, 0.0
                    if kind == "F" and s > 0:
                        if ("F", s - 1, mb) not in index:
                            break
                        pred = index[("F", s - 1, mb)]
                        send = self.send_f[s - 1] if self.stage_to_rank[s - 1] != r else 0.0
                    elif kind in ("B", "I") and s < n_st - 1:
                        if ("B", s + 1, mb) not in index:
                            break
                        pred = index[("B", s + 1, mb)]
                        send = self.send_b[s + 1] if self.stage_to_rank[s + 1] != r else 0.0
                    code = {"F": 0, "B": 1, "I": 2, "W": 3}[kind]
                    if kind != "W":
                        index[("B" if kind in ("B", "I") else "F", s, mb)] = len(out)
                    out.append((r, s, code, pred, send, mb))
                    ptr[r] += 1
                    left -= 1
                    progressed = True
            if not progressed:
                raise RuntimeError("clock DAG deadlocked (schedule dependencies not satisfiable)")
        self._order = out
        return out

    def span(self, rank_clocks: Sequence[int]) -> tuple[float, list[float]]:
        """(pipeline span, per-rank end) at ``rank_clocks``: list scheduling in the fixed topological order."""
        f_d, i_d, w_d, _ = self._durations(rank_clocks)
        dur = [f_d, [i + w for i, w in zip(i_d, w_d, strict=True)], i_d, w_d]
        free = [0.0] * self.pp
        end: list[float] = []
        copy = self.copies.in_action
        for r, s, code, pred, send, mb in self.topo():
            t = free[r]
            if pred >= 0:
                dep = end[pred] + send
                if dep > t:
                    t = dep
            t += dur[code][s]
            if copy:
                t += copy.get(("FBIW"[code], s, mb), 0.0)
            end.append(t)
            free[r] = t
        free = [f + a for f, a in zip(free, self.after_s, strict=True)]
        return max(free), free

    def evaluate(self, rank_clocks: Sequence[int]) -> DagPoint:
        """Iteration time (span + tail) and GPU energy of all devices at ``rank_clocks``."""
        span, _ = self.span(rank_clocks)
        t = span + self.tail_s
        _, _, _, comp = self._durations(rank_clocks)
        m = self.num_microbatches
        energy = 0.0
        busy = [0.0] * self.pp
        for s in range(len(comp)):
            r = self.stage_to_rank[s]
            mhz = rank_clocks[r]
            fwd, bwd = self.table.at(s, mhz)
            cf = self.compute_f[s] * fwd.stretch
            cb = comp[s] - cf
            energy += m * (self.power.phase_power_w(mhz, fwd) * cf + self.power.phase_power_w(mhz, bwd) * cb)
            busy[r] += m * comp[s]
            copy = self.copies.stage_total[s]
            energy += self.power.busy_power_w(mhz, 0.0) * copy
            busy[r] += copy
        energy += sum(self.power.blocked_power_W * max(0.0, t - b) for b in busy)
        return DagPoint(tuple(rank_clocks), t, energy * self.devices_per_rank)


__all__ = ["ClockDag", "DagPoint"]
