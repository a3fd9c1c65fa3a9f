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
from typing import Any

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
        self.capacity = capacity
        self.on_link: dict[Any, list[Flow]] = {}
        self.bytes_by_link_type: dict[str, float] = {}

    def start(self, links: tuple[Any, ...], mult: tuple[int, ...], size: float, cap: float, prio: int,
              done: Callable[[], None]) -> None:
        """Start a flow of ``size`` units; ``done()`` is called when it has been delivered."""
        if size <= _EPS:
            done()
            return
        f = Flow(links, mult, size, cap, prio, done)
        f.last = self.env.now
        for link in links:
            self.on_link.setdefault(link, []).append(f)
        self._reallocate(f)

    def _finish(self, f: Flow, version: int) -> None:
        if version != f.version:
            return  # superseded by a later rate change
        for link in f.links:
            self.on_link[link].remove(f)
        f.remaining = 0.0
        neighbours = [g for link in f.links for g in self.on_link[link]]
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
            f.rate = min([f.cap] + [self.capacity(link) / m for link, m in zip(f.links, f.mult, strict=True)])
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
        ev = self.env.timeout(f.remaining / f.rate)
        version = f.version
        ev.callbacks.append(lambda _e: self._finish(f, version))


class Transfers:
    """Runs collectives and p2p transfers (a sequence of phases) on a :class:`FluidNetwork`."""

    def __init__(self, env: simpy.Environment, net: FluidNetwork, topo: Topology, comm: CommModel) -> None:
        self.env = env
        self.net = net
        self.topo = topo
        self.comm = comm
        self._cap_cache: dict[tuple[str, float, int, str], float] = {}
        self._lat_cache: dict[tuple[str, int, str], float] = {}

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

    def run(self, phases: list[Phase], prio: int, done: Callable[[], None]) -> None:
        """Run ``phases`` one after another; call ``done()`` when the last flow has landed."""
        if not phases:
            done()
            return
        self._run_phase(phases, 0, prio, done)

    def _run_phase(self, phases: list[Phase], k: int, prio: int, done: Callable[[], None]) -> None:
        phase = phases[k]
        nxt: Callable[[], None] = done if k + 1 == len(phases) else (lambda: self._run_phase(phases, k + 1, prio, done))
        pending = [len(phase.flows)]

        def flow_done() -> None:
            pending[0] -= 1
            if pending[0] == 0:
                nxt()

        def start_flows(_e: object = None) -> None:
            for fs in phase.flows:
                self.net.bytes_by_link_type[fs.link_type] = self.net.bytes_by_link_type.get(fs.link_type, 0.0) + fs.nbytes
                self.net.start(fs.links, fs.multiplicity, fs.nbytes, self._flow_cap(phase, fs.links), prio, flow_done)

        lat = self._latency(phase) * phase.count
        if lat > 0.0:
            self.env.timeout(lat).callbacks.append(start_flows)
        else:
            start_flows()


__all__ = ["Flow", "FluidNetwork", "Transfers"]
