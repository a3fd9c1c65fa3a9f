"""Fluid (processor-sharing) model of links shared by concurrent transfers, on simpy.

Every active flow crosses one or more links; link capacity is divided max-min fairly among the
flows on it (progressive filling, Bertsekas & Gallager §6.5.2), each flow also capped by the
rate it reaches alone (link bandwidth × the comm model's efficiency for its message size). A flow
that stands for k identical flows of symmetric replicas (``multiplicity``) takes k shares. Rates
are recomputed whenever a flow starts or ends, only over the connected component of flows that
share links with it, so the cost stays proportional to local contention.

Priority classes (MindPipe's ``comm_priority``): with ``pp_first`` pipeline p2p flows are filled
first and the other traffic shares what is left — the scheduling analogue of giving PP sends
their own high-priority NCCL stream; with ``fair`` all flows share equally.

The same machinery prices compute on CPU ranks that share cores: a ``("cores", node)`` link whose
capacity is the number of ranks the cores can run at full speed, and compute "flows" whose size
is their duration alone.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import simpy
from mindpipe.simulator.costs import CommModel
from mindpipe.simulator.topology import Phase, Topology

_EPS = 1e-12


class Flow:
    """An active transfer (or shared-compute job) on one or more links."""

    __slots__ = ("cap", "done", "last", "links", "mult", "prio", "rate", "remaining", "version")

    def __init__(self, links: tuple[Any, ...], mult: tuple[int, ...], size: float, cap: float, prio: int,
                 done: Callable[[], None]) -> None:
        self.links = links
        self.mult = mult
        self.remaining = size
        self.cap = cap
        self.prio = prio
        self.rate = 0.0
        self.last = 0.0
        self.version = 0
        self.done = done


class FluidNetwork:
    """Links with capacities, active flows on them, and simpy events for their completion."""

    def __init__(self, env: simpy.Environment, capacity: Callable[[Any], float]) -> None:
        self.env = env
        self._capacity = capacity
        self._caps: dict[Any, float] = {}
        self.on_link: dict[Any, list[Flow]] = {}
        self.bytes_by_link_type: dict[str, float] = {}

    def capacity(self, link: Any) -> float:
        """Capacity of ``link`` (constant over a run; asked once per link)."""
        c = self._caps.get(link)
        if c is None:
            c = self._caps[link] = self._capacity(link)
        return c

    def start(self, links: tuple[Any, ...], mult: tuple[int, ...], size: float, cap: float, prio: int,
              done: Callable[[], None], alone_rate: float | None = None) -> None:
        """Start a flow of ``size`` units; ``done()`` is called when it has been delivered.

        ``alone_rate`` is :meth:`alone_rate` of the flow, where the caller has it at hand.
        """
        if size <= _EPS:
            done()
            return
        f = Flow(links, mult, size, cap, prio, done)
        f.last = self.env.now
        alone = True
        for link in links:
            on = self.on_link.get(link)
            if on is None:
                self.on_link[link] = [f]
            else:
                alone = alone and not on
                on.append(f)
        if not alone:
            self._reallocate(f)
            return
        # Alone on its links (the usual case): its own component, rate as in _reallocate.
        f.rate = self.alone_rate(links, mult, cap) if alone_rate is None else alone_rate
        self._schedule(f)

    def alone_rate(self, links: tuple[Any, ...], mult: tuple[int, ...], cap: float) -> float:
        """Rate of a flow with no other flow on its links: its cap or its links' share, whichever is lower."""
        return min([cap] + [self.capacity(link) / m for link, m in zip(links, mult, strict=True)])

    def _finish(self, f: Flow, version: int, _event: object = None) -> None:
        if version != f.version:
            return  # superseded by a later rate change
        neighbours: list[Flow] = []
        for link in f.links:
            on = self.on_link[link]
            on.remove(f)
            neighbours += on
        f.remaining = 0.0
        f.done()
        if neighbours:
            self._reallocate(neighbours[0], extra=neighbours)

    def _component(self, seeds: list[Flow]) -> list[Flow]:
        seen = {id(f): f for f in seeds}
        stack = list(seeds)
        while stack:
            f = stack.pop()
            for link in f.links:
                for g in self.on_link[link]:
                    if id(g) not in seen:
                        seen[id(g)] = g
                        stack.append(g)
        return list(seen.values())

    def _reallocate(self, seed: Flow, extra: list[Flow] | None = None) -> None:
        comp = self._component(extra if extra else [seed])
        now = self.env.now
        old = {}
        for f in comp:
            if f.rate > 0.0:
                f.remaining = max(f.remaining - f.rate * (now - f.last), 0.0)
            f.last = now
            old[id(f)] = f.rate
        if len(comp) == 1:
            f = comp[0]
            f.rate = self.alone_rate(f.links, f.mult, f.cap)
        else:
            self._fill(comp)
        for f in comp:
            if f.rate != old[id(f)]:
                self._schedule(f)

    def _fill(self, comp: list[Flow]) -> None:
        """Progressive filling by priority class: max-min fair with per-flow caps and multiplicities."""
        residual: dict[Any, float] = {}
        for f in comp:
            for link in f.links:
                if link not in residual:
                    residual[link] = self.capacity(link)
        for prio in sorted({f.prio for f in comp}):
            active = [f for f in comp if f.prio == prio]
            for f in active:
                f.rate = 0.0
            while active:
                load: dict[Any, int] = {}
                for f in active:
                    for link, m in zip(f.links, f.mult, strict=True):
                        load[link] = load.get(link, 0) + m
                share = {link: residual[link] / n for link, n in load.items()}
                best = min(min(share.values()), min(f.cap for f in active))
                best = max(best, 0.0)
                frozen = []
                for f in active:
                    fair = min(share[link] for link in f.links)
                    if f.cap <= best + _EPS or fair <= best + _EPS * max(1.0, best):
                        frozen.append(f)
                for f in frozen:
                    f.rate = best
                    for link, m in zip(f.links, f.mult, strict=True):
                        residual[link] = max(residual[link] - best * m, 0.0)
                active = [f for f in active if f not in frozen]

    def _schedule(self, f: Flow) -> None:
        f.version += 1
        if f.rate <= 0.0:
            return  # starved by higher-priority traffic; rescheduled when that ends
        self.env.timeout(f.remaining / f.rate).callbacks.append(partial(self._finish, f, f.version))


def solo_times(owned: list[tuple[int, list[Phase]]], shared: list[list[Phase]],
               time_alone: Callable[[list[Phase]], float]) -> list[float | None]:
    """For each owned phase list, its time alone where nothing can share its links, else None.

    ``owned`` are (owner, phases): an owner runs its lists one at a time (a rank waits for its
    tensor-parallel collectives). ``shared`` are all other transfers, which may run at any time.
    A list runs alone when every link it crosses is crossed only by lists of its owner and the
    flows of each of its phases cross disjoint links: then no flow ever shares a link, the fluid
    model gives each its uncontended rate throughout, and its time is ``time_alone(phases)``.
    """
    users: dict[Any, Any] = {}
    contended = object()

    def use(phases: list[Phase], who: Any) -> None:
        for ph in phases:
            for fs in ph.flows:
                for link in fs.links:
                    if users.setdefault(link, who) != who:
                        users[link] = contended

    for phases in shared:
        use(phases, contended)
    for who, phases in owned:
        use(phases, who)

    def alone(who: Any, phases: list[Phase]) -> bool:
        for ph in phases:
            links = [link for fs in ph.flows for link in set(fs.links)]
            if len(links) != len(set(links)) or any(users[link] != who for link in links):
                return False
        return True

    return [time_alone(phases) if alone(who, phases) else None for who, phases in owned]


class Transfers:
    """Runs collectives and p2p transfers (a sequence of phases) on a :class:`FluidNetwork`."""

    def __init__(self, env: simpy.Environment, net: FluidNetwork, topo: Topology, comm: CommModel) -> None:
        self.env = env
        self.net = net
        self.topo = topo
        self.comm = comm
        self._cap_cache: dict[tuple[str, float, int, str], float] = {}
        self._lat_cache: dict[tuple[str, int, str], float] = {}
        self._steps_memo: dict[int, tuple[list[Phase], tuple[_Step, ...]]] = {}

    def phase_time_alone(self, phase: Phase) -> float:
        """Uncontended time of one phase (latency + slowest flow at its capped rate)."""
        lat = self._latency(phase) * phase.count
        worst = 0.0
        for fs in phase.flows:
            cap = self._flow_cap(phase, fs.links)
            rate = min([cap] + [self.topo.link_capacity(lk) / m for lk, m in zip(fs.links, fs.multiplicity, strict=True)])
            worst = max(worst, fs.nbytes / rate)
        return lat + worst

    def phase_host_s(self, phase: Phase) -> float:
        """Host CPU time of ``phase`` where the comm model fitted it (host copies), else its time alone."""
        host = getattr(self.comm, "host_cpu_s", None)
        t = host(phase) if host is not None else None
        return self.phase_time_alone(phase) if t is None else t

    def phase_wait_s(self, phase: Phase) -> float:
        """Wall time the collectives of ``phase`` wait for their peers where the comm model fitted
        it (CPU hosts: ``LinkCalibration.tp_wait_s``), else 0."""
        wait = getattr(self.comm, "wait_s", None)
        return wait(phase) if wait is not None else 0.0

    def _latency(self, phase: Phase) -> float:
        key = (phase.op, phase.group_size, phase.link_type)
        lat = self._lat_cache.get(key)
        if lat is None:
            lat = self._lat_cache[key] = self.comm.latency_s(phase.op, phase.group_size, phase.link_type)
        return lat

    def _flow_cap(self, phase: Phase, links: tuple[Any, ...]) -> float:
        key = (phase.op, phase.msg_bytes, phase.group_size, phase.link_type)
        eff = self._cap_cache.get(key)
        if eff is None:
            eff = self._cap_cache[key] = self.comm.efficiency(phase.op, int(phase.msg_bytes), phase.group_size,
                                                              phase.link_type)
        return eff * min(self.topo.link_capacity(lk) for lk in links)

    def time_alone(self, phases: list[Phase]) -> float:
        """Uncontended time of ``phases`` run one after another."""
        return sum(self.phase_time_alone(p) for p in phases)

    def _steps(self, phases: list[Phase]) -> tuple[_Step, ...]:
        """``phases`` with their latencies and flow caps worked out (memoised per phase list).

        The work lists hold the same phase lists for every micro-batch; the memo keeps the list
        itself so that its id is not reused while the memo lives.
        """
        hit = self._steps_memo.get(id(phases))
        if hit is not None and hit[0] is phases:
            return hit[1]
        steps: list[_Step] = []
        for ph in phases:
            flows = []
            for fs in ph.flows:
                cap = self._flow_cap(ph, fs.links)
                flows.append((fs.links, fs.multiplicity, fs.nbytes, cap, fs.link_type,
                              self.net.alone_rate(fs.links, fs.multiplicity, cap)))
            steps.append(_Step(self._latency(ph) * ph.count, tuple(flows)))
        compiled = tuple(steps)
        self._steps_memo[id(phases)] = (phases, compiled)
        return compiled

    def run(self, phases: list[Phase], prio: int, done: Callable[[], None]) -> None:
        """Run ``phases`` one after another; call ``done()`` when the last flow has landed."""
        if not phases:
            done()
            return
        self._run_step(self._steps(phases), 0, prio, done)

    def _run_step(self, steps: tuple[_Step, ...], k: int, prio: int, done: Callable[[], None]) -> None:
        step = steps[k]
        nxt = done if k + 1 == len(steps) else partial(self._run_step, steps, k + 1, prio, done)
        if len(step.flows) != 1:
            nxt = _Countdown(len(step.flows), nxt)
        if step.latency > 0.0:
            self.env.timeout(step.latency).callbacks.append(partial(self._start_flows, step, prio, nxt))
        else:
            self._start_flows(step, prio, nxt)

    def _start_flows(self, step: _Step, prio: int, done: Callable[[], None], _event: object = None) -> None:
        by_type = self.net.bytes_by_link_type
        for links, mult, nbytes, cap, link_type, alone_rate in step.flows:
            by_type[link_type] = by_type.get(link_type, 0.0) + nbytes
            self.net.start(links, mult, nbytes, cap, prio, done, alone_rate)


class _Step(NamedTuple):
    """A phase ready to run: its latency, then flows as (links, multiplicity, bytes, cap, link type, alone rate)."""

    latency: float
    flows: tuple[tuple[tuple[Any, ...], tuple[int, ...], float, float, str, float], ...]


class _Countdown:
    """Calls ``done()`` on the ``n``-th call (all flows of a phase have landed)."""

    __slots__ = ("done", "n")

    def __init__(self, n: int, done: Callable[[], None]) -> None:
        self.n = n
        self.done = done

    def __call__(self) -> None:
        self.n -= 1
        if self.n == 0:
            self.done()


__all__ = ["Flow", "FluidNetwork", "Transfers"]
