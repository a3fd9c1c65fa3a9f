"""Discrete-event simulation of one training iteration (simpy).

One representative pipeline is simulated (data-parallel rank 0, tensor-parallel rank 0); data
replicas and TP peers run the same program at the same time, and their traffic on shared links
enters through flow multiplicities (:mod:`mindpipe.simulator.topology`). Each pipeline rank replays its
schedule's action list (BACKGROUND.md §1.3): an action starts when the rank is free and its
inputs have arrived —

* ``F(s, μ)`` needs the activation of ``F(s−1, μ)`` (a p2p transfer unless both stages share a rank);
* ``B/I(s, μ)`` needs the gradient of ``B/I(s+1, μ)``; ``W(s, μ)`` follows ``I(s, μ)`` on the rank.

An action is its compute followed by its tensor-parallel collectives (Megatron issues them
synchronously inside the layer, so the rank waits for them; on a CPU host whose ranks share the
cores, a calibration adds each one's wait for its peers, ``LinkCalibration.tp_wait_s``); under ``tp_comm_overlap`` (Transformer
Engine's userbuffers) the part of each collective its GEMM hides
(:func:`~mindpipe.simulator.collectives.overlapped_exposed_s`, priced alone) is taken off the
action. Full or selective recompute adds the re-run forward (and, for full, its collectives) before
the input-gradient work. Pipeline sends are asynchronous for the sender (torch.distributed.pipelining),
or under ``blocking_p2p`` (Megatron-LM, which waits on each batched send/recv) the sender starts its
next action only when the send has landed. Gradients of a stage are
reduced over data parallelism in buckets issued while the stage's last backward computes (Megatron
``--overlap-grad-reduce``, PyTorch DDP bucketing); with ZeRO ≥ 1 they are reduce-scattered, ZeRO-1/2
all-gather the updated parameters after the optimizer step (under ``overlap_param_gather`` only the
first bucket and what one micro-batch's forward cannot cover count: the rest runs under the next
iteration's forward) and ZeRO-3 gathers each stage's parameters before its first forward (FSDP2
under PP keeps them unsharded for the step; torchtitan), and without pipelining again before every
backward (:func:`mindpipe.traces.layout.reshards_after_forward`), one all-gather per sharded module
(FSDP2's units: the stage's own parameters, then each block's); on dedicated devices only the
first precedes the action and the others are prefetched under its compute, the action ending no
earlier than the last unit's share of its compute after that unit's gather (on CPU ranks sharing
cores they block, as the executor's measured runs show). Under sequence parallelism the
norms' partial weight gradients are all-reduced over the TP group once, after the rank's
reductions and before its step (:func:`mindpipe.simulator.costs.partial_grad_params`). Without pipelining ZeRO-2/3
reduce-scatter in every backward as it produces the gradients and gather the weights again before
every forward but the first (:func:`mindpipe.traces.layout.reduces_every_microbatch`); on CPU ranks
sharing a host's cores that reduce-scatter blocks the rank inside the backward (gloo has no
streams), and every data-parallel collective waits for its peers after its host copies, as a
tensor-parallel one does (``LinkCalibration.tp_wait_s``). The iteration ends when the
slowest rank has finished its optimizer step.

Cost (issue 14: 1,024 GPUs, m·p = 2,048 in about 0.05 s on one core): a rank's tensor-parallel
collectives go through the fluid network only when another transfer could share their links;
where none can (TP inside a node, on NVLink ports nothing else uses) their time alone is exactly
what the network would give, so it is added to the action's compute delay and an action costs
one event. A pipeline input is a flag, with an event only while a rank waits for it. The
engine's records (work, options, result) live in :mod:`mindpipe.simulator.work`.
"""

from __future__ import annotations

from typing import Literal, cast

import simpy
from mindpipe.simulator.actions import Action, Schedule, prefetched_backward
from mindpipe.simulator.collectives import overlapped_exposed_s
from mindpipe.simulator.network import solo_times
from mindpipe.simulator.topology import Phase
from mindpipe.simulator.work import (
    EngineOptions,
    EngineResult,
    RankWork,
    StageWork,
    TimelineEvent,
    TpOverlap,
    last_grad_index,
)


class Engine:
    """Simulate ``schedule`` with per-stage work on a fluid network."""

    def __init__(self, schedule: Schedule, stages: list[StageWork], ranks: list[RankWork], transfers_factory,
                 options: EngineOptions | None = None) -> None:
        self.schedule = schedule
        self.stages = stages
        self.ranks = ranks
        self.opt = options or EngineOptions()
        self._on_cores = self.opt.comm_on_cores and self.opt.cores_per_rank_slots is not None
        self.env = simpy.Environment()
        self.net, self.tr = transfers_factory(self.env)
        if len(stages) != schedule.num_stages:
            raise ValueError(f"{len(stages)} stage costs for a schedule of {schedule.num_stages} stages")
        m, n_st = schedule.num_microbatches, schedule.num_stages
        # Arrival of F(s, μ)'s input and B/I(s, μ)'s output gradient, at index s·m + μ: a flag, and
        # an event only while a rank waits for it (most inputs land before they are needed).
        self._m = m
        self.arrived = ([False] * (n_st * m), [False] * (n_st * m))
        self._waiting: tuple[dict[int, simpy.Event], dict[int, simpy.Event]] = ({}, {})
        self.params_ready = [self.env.event() for _ in range(n_st)]
        # FSDP2 prefetches the next unit's all-gather under the current unit's compute where the
        # host issues work ahead of a device; on CPU ranks sharing cores every gather blocks.
        self._prefetch_gathers = self.opt.cores_per_rank_slots is None
        self._params_rest: dict[int, simpy.Process] = {}  # a stage's first gather still in flight
        self.swapped_in: dict[tuple[int, int], simpy.Event] = {}
        self._chained: set[tuple[int, int]] = set()  # backwards whose swapped blocks come back one ahead
        # A (stage, micro-batch)'s copy to the host has landed: its copy back starts no earlier.
        self._swapped_out: dict[tuple[int, int], simpy.Event] = {}
        self._swap_heads: dict[tuple[int, int], simpy.Process] = {}  # copies out streaming beside a forward
        self._has_swap = any(st.swap_in for st in stages)
        # Each stage's model chunk on its rank (0: the rank's lowest stage), for the timeline.
        self._chunk = {st: i for r in range(schedule.pp) for i, st in enumerate(schedule.stages_of_rank(r))}
        pp = schedule.pp
        self.busy = [0.0] * pp
        self.compute = [0.0] * pp
        self.end = [0.0] * pp
        self.last_compute_end = [0.0] * pp
        self.exposed_dp = [0.0] * pp
        self.comm_busy = [0.0] * pp
        self.timeline: list[TimelineEvent] | None = [] if self.opt.record else None
        self.compute_done = [self.env.event() for _ in range(pp)]
        self._tied_ready = [self.env.event() for _ in range(pp)]  # a rank is ready to sum the tied table
        self._last_grad = [self._last_grad_index(r) for r in range(pp)]
        self._dp_waiters: list[list[simpy.Process]] = [[] for _ in range(pp)]
        self._solo, self._solo_partial = self._solo_tp_times()
        self._hidden = [(self._hidden_s(st.fwd_tp_overlap), self._hidden_s(st.bwd_tp_overlap)) for st in stages]
        if self.opt.cores_per_rank_slots is not None:
            topo = self.tr.topo
            # The rank's dp × tp replicas on the node compute the same work at the same time.
            self._cores = [((("cores", topo.node(topo.rep(r))),), (topo.replicas_on_node(r),)) for r in range(pp)]
        self._tp_wait = self._tp_wait_s()

    def _solo_tp_times(self) -> tuple[list[tuple[float | None, float | None]], list[float | None]]:
        """Per stage, the (forward, backward) TP collectives' time where they provably run alone; per
        rank, its norms' gradient all-reduce's (``RankWork.partial_grad_reduce``, also on the TP group).

        A rank waits for its TP collectives, so one rank's never overlap each other; where no
        other transfer of the iteration crosses their links, their fluid time is their time alone
        (:func:`~mindpipe.simulator.network.solo_times`). None: they run on the network.
        """
        if self._on_cores:
            return [(None, None)] * len(self.stages), [None] * len(self.ranks)
        owned: list[tuple[int, list[Phase]]] = []
        shared: list[list[Phase]] = []
        for s, st in enumerate(self.stages):
            r = self.schedule.stage_to_rank[s]
            owned += [(r, st.fwd_tp), (r, st.bwd_tp)]
            shared += [st.send_fwd or [], st.send_bwd or [], st.swap_out, st.swap_out_tail, st.swap_in, st.swap_chain_in,
                       st.swap_weight_in, *st.dp_buckets,
                       *st.gather_buckets, *st.forward_regather_buckets]
        for r, rw in enumerate(self.ranks):
            shared += [*rw.param_gather, rw.tied_exchange]
            owned.append((r, rw.partial_grad_reduce))
        times = solo_times(owned, shared, self.tr.time_alone)
        n = 2 * len(self.stages)
        return list(zip(times[0:n:2], times[1:n:2], strict=True)), times[n:]

    def _tp_wait_s(self) -> list[tuple[float, float, float]] | None:
        """Per stage, the (forward, backward, W re-run) TP collectives' wait for their peers where
        the ranks share a host's cores and the calibration fitted it (``LinkCalibration.tp_wait_s``):
        wall time after their host copies, off the cores. None: no such wait."""
        if not self._on_cores:
            return None
        wait = self.tr.phase_wait_s
        out = [(sum(map(wait, st.fwd_tp)), sum(map(wait, st.bwd_tp)), sum(map(wait, st.rerun_tp))) for st in self.stages]
        return out if any(any(w) for w in out) else None

    def _hidden_s(self, overlaps: list[TpOverlap]) -> float:
        """Seconds of a stage's TP collectives that their GEMMs hide under ``tp_comm_overlap``.

        Each collective's time alone minus what stays exposed when it pipelines with its GEMM
        (:func:`~mindpipe.simulator.collectives.overlapped_exposed_s`). It never exceeds the GEMMs
        (part of the action's compute) nor the collectives (part of its TP phases); the action
        spends that much less. Where the collectives share links (on the fluid network) their time
        alone is the part taken back, the rest of their network time stays exposed.
        """
        out = 0.0
        for o in overlaps:
            alone = self.tr.time_alone(o.phases)
            out += o.count * (alone - overlapped_exposed_s(alone, o.gemm_s, o.chunks))
        return out

    def _solo_bytes(self) -> dict[str, float]:
        """Bytes per link type of the TP collectives that ran alone (off the network).

        Every micro-batch passes every stage once forward and once backward (B or I), so each
        stage ran its forward and its backward collectives m times; a rank's norm-gradient
        all-reduce runs once.
        """
        out: dict[str, float] = {}
        for st, solo in zip(self.stages, self._solo, strict=True):
            for phases, t in ((st.fwd_tp, solo[0]), (st.bwd_tp, solo[1])):
                if t is None:
                    continue
                for fs in (fs for ph in phases for fs in ph.flows):
                    out[fs.link_type] = out.get(fs.link_type, 0.0) + self._m * fs.nbytes
        for rw, t in zip(self.ranks, self._solo_partial, strict=True):
            if t is not None:
                for fs in (fs for ph in rw.partial_grad_reduce for fs in ph.flows):
                    out[fs.link_type] = out.get(fs.link_type, 0.0) + fs.nbytes
        return out

    def _last_grad_index(self, r: int) -> dict[int, int]:
        return last_grad_index(self.schedule.orders[r])

    # -- helpers ------------------------------------------------------------------------------
    def _prio(self, pp_traffic: bool) -> int:
        return 0 if (pp_traffic or not self.opt.pp_first) else 1

    def _host_copy(self, r: int, phases: list[Phase]) -> simpy.Event:
        """``phases`` as host-copy work on rank ``r``'s cores (``comm_on_cores``)."""
        return self._compute(r, sum(self.tr.phase_host_s(p) for p in phases))

    def _transfer(self, r: int | None, phases: list[Phase], pp_traffic: bool = False) -> simpy.Event:
        """Run ``phases``; ``r`` is the issuing rank for collectives and sends (None: swaps)."""
        if r is not None and self._on_cores:
            return self._host_copy(r, phases)
        ev = self.env.event()
        self.tr.run(phases, self._prio(pp_traffic), ev.succeed)
        return ev

    def _compute(self, r: int, seconds: float) -> simpy.Event:
        if self.opt.cores_per_rank_slots is None:
            return self.env.timeout(seconds)
        ev = self.env.event()
        links, mult = self._cores[r]
        self.net.start(links, mult, seconds, 1.0, 0, ev.succeed)
        return ev

    def _record(self, r: int, thread: Literal["compute", "comm"], name: str, start: float, end: float,
                cat: str, chunk: int = 0) -> None:
        if self.timeline is not None and end > start:
            self.timeline.append(TimelineEvent(r, thread, name, start, end, cat, chunk=chunk))

    def _wait_input(self, grad: int, i: int) -> simpy.Event:
        """An event that fires when input ``i`` (0: activation, 1: gradient) lands."""
        ev = self._waiting[grad][i] = self.env.event()
        return ev

    def _land(self, grad: int, i: int) -> None:
        self.arrived[grad][i] = True
        ev = self._waiting[grad].pop(i, None)
        if ev is not None:
            ev.succeed()

    # -- processes ----------------------------------------------------------------------------
    def _rank(self, r: int):
        env = self.env
        stages, solo, hidden_s = self.stages, self._solo, self._hidden
        last_grad = self._last_grad[r]
        order = self.schedule.orders[r]
        n_st, m = self.schedule.num_stages, self._m
        arrived_f, arrived_b = self.arrived
        # On dedicated devices compute is a plain delay, and TP collectives that run alone
        # (solo_tp_times) add their time to it: one event per action.
        plain = self.opt.cores_per_rank_slots is None
        busy = compute = comm_busy = 0.0
        gap = self._overhead_slices(r)
        tp_wait = self._tp_wait
        phases: list[Phase] | None  # an action's TP collectives (None: a W action that re-runs none)
        for idx, a in enumerate(order):
            s, mb, kind = a.stage, a.microbatch, a.kind
            st = stages[s]
            if gap is not None:
                # Bookkeeping between actions runs on the rank's thread, waits or not.
                yield from self._overhead(r, *gap)
            pending: tuple[simpy.Process, int] | None = None  # gathers prefetched under this action
            if kind == "F":
                if s > 0 and not arrived_f[s * m + mb]:
                    yield self._wait_input(0, s * m + mb)
                if st.gather_buckets:
                    if not self.params_ready[s].processed:
                        yield self.params_ready[s]
                    in_flight = self._params_rest.pop(s, None)
                    pending = None if in_flight is None else (in_flight, len(st.gather_buckets))
                if mb > 0 and st.forward_regather_buckets:
                    pending = yield from self._gather_ahead(r, s, st.forward_regather_buckets)
                comp, phases, alone = st.forward_s, st.fwd_tp, solo[s][0]
                hidden = hidden_s[s][0]
                if st.mb_stretch is not None:
                    comp *= st.mb_stretch[mb][0]
            elif kind == "W":
                if st.swap_weight_in:  # its swapped GEMM inputs, copied back on the compute stream as W asks
                    yield from self._comm(r, st.swap_weight_in, f"swap-in {a}", "swap", False)
                phases = st.rerun_tp or None
                comp, alone, hidden = st.weight_action_s, (None if phases else 0.0), 0.0
                if st.mb_stretch is not None:
                    comp *= st.mb_stretch[mb][1]
            else:
                if s < n_st - 1 and not arrived_b[s * m + mb]:
                    yield self._wait_input(1, s * m + mb)
                if self._has_swap:
                    if st.swap_lazy and st.swap_in and (s, mb) not in self.swapped_in:
                        # copied back as the backward asks: all its bytes, from its start, in the open
                        self.swapped_in[(s, mb)] = env.process(self._swap_back(
                            r, st.swap_in + st.swap_chain_in, self._swap_out_event((s, mb)), a))
                    ev = self.swapped_in.get((s, mb))
                    if ev is not None and not ev.processed:
                        yield ev
                if st.regather_buckets:
                    pending = yield from self._gather_ahead(r, s, st.regather_buckets)
                comp = st.recompute_s + st.input_s + (st.weight_s if kind == "B" else 0.0)
                if st.mb_stretch is not None:
                    comp *= st.mb_stretch[mb][1]
                phases, alone = st.bwd_tp, solo[s][1]
                hidden = hidden_s[s][1]
            start = env.now
            if self._has_swap and idx + 1 < len(order):
                self._prefetch(order[idx + 1], prefetched_backward(order, idx) is not None, a)
            if kind in ("B", "I") and (s, mb) in self._chained and st.swap_chain_in:
                # a prefetched backward brings its other swapped blocks back one ahead during it
                comp += st.swap_chain_s
                env.process(self._comm(r, st.swap_chain_in, f"swap-in {a} (during)", "swap", False))
            if kind == "F" and st.swap_out:  # the copy out streams beside the forward (StageWork.swap_stream_s)
                self._swap_heads[(s, mb)] = env.process(self._swap_out_head(r, st, a, start + comp))
            blocking_reduce = False
            reduce_here = idx == last_grad.get(s) or (st.reduce_every_backward and kind in ("B", "W"))
            # The data-parallel wrapper's copies inside the action (weights out of a gather, gradients
            # into a reduction from the backward's hooks); the rest after the rank's last action.
            comp += st.copy_in_action_s(kind, mb, idx == last_grad.get(s), self.opt.overlap_grad_reduce)
            reduces = bool(st.dp_buckets) and reduce_here
            if reduces:
                # On a host's shared cores FSDP2's per-backward reduce-scatter blocks the rank's
                # thread (gloo has no streams): run inside the action, after its compute.
                blocking_reduce = self._on_cores and st.reduce_every_backward
                if not blocking_reduce:
                    self._dp_waiters[r].append(env.process(self._reduce_grads(r, s, start, comp)))
            # tp_comm_overlap: the collectives' hidden part runs under the GEMMs, so the action
            # spends that much less (counted as compute, not as TP communication).
            if plain and alone is not None:
                if comp + alone - hidden > 0.0:
                    yield env.timeout(comp + alone - hidden)
                cend = start + comp
            else:
                if comp - hidden > 0.0:
                    yield self._compute(r, comp - hidden)
                cend = env.now + hidden
                if phases:
                    yield env.timeout(alone) if alone is not None else self._transfer(r, phases)
                    if tp_wait is not None and (wait := tp_wait[s][0 if kind == "F" else 2 if kind == "W" else 1]) > 0:
                        # Blocked for the peers: wall time, off the shared cores.
                        yield env.timeout(wait)
            if pending is not None:
                # The last unit's share of the compute runs after its gather lands.
                rest, units = pending
                if not rest.processed:
                    yield rest
                landed = cast(float, rest.value)  # _gather_rest returns the time its last unit landed
                if (late := landed + comp / units - env.now) > 0:
                    yield env.timeout(late)
            if blocking_reduce:
                yield from self._reduce_grads(r, s, env.now, 0.0)
            end = env.now
            if phases:
                comm_busy += max(end - cend, 0.0)
            busy += end - start
            compute += cend - start
            self.last_compute_end[r] = end
            if self.timeline is not None:
                self._record(r, "compute", str(a), start, end, kind, self._chunk[a.stage])
            sent = self._after(r, a, st)
            if sent is not None and self.opt.blocking_p2p:
                # Megatron waits on the batched send/recv before its next action (not busy: blocked).
                yield sent
        after = self._copy_in_after(r)
        if after > 0.0:
            start = env.now
            yield self._compute(r, after)
            busy += env.now - start
            compute += env.now - start
            self.last_compute_end[r] = env.now
            self._record(r, "compute", "gradient copy-in", start, env.now, "copy")
        self.busy[r], self.compute[r], self.comm_busy[r] = busy, compute, comm_busy
        self.compute_done[r].succeed()

    def _copy_in_after(self, r: int) -> float:
        """Compute seconds rank ``r`` spends after its last action copying gradients into the
        reduction's buffers (:meth:`StageWork.copy_after_s`; the copies of all the rank's stages are
        put after its last action)."""
        return sum(self.stages[s].copy_after_s(self.opt.overlap_grad_reduce) for s in self.schedule.stages_of_rank(r))

    def _after(self, r: int, a: Action, st: StageWork) -> simpy.Event | None:
        """Post the sends that action ``a`` enables; the event of its pipeline send, if one crosses ranks."""
        s = a.stage
        if a.kind == "F":
            if st.swap_out_tail:
                self.env.process(self._swap_out(r, st.swap_out_tail, a, self._swap_heads.pop((s, a.microbatch), None)))
            if s + 1 < self.schedule.num_stages:
                return self._send(r, st.send_fwd, 0, (s + 1) * self._m + a.microbatch, a, s + 1)
        elif a.kind != "W" and s > 0:
            return self._send(r, st.send_bwd, 1, (s - 1) * self._m + a.microbatch, a, s - 1)
        return None

    def _send(self, r: int, phases: list[Phase] | None, grad: int, i: int, a: Action, dst: int) -> simpy.Event | None:
        """Send action ``a``'s output (``grad`` 0) or input gradient (1) to stage ``dst``, as input ``i``.

        Returns an event that fires when the send has landed (None when the stages share a rank); only
        ``blocking_p2p`` waits for it.
        """
        if not phases:
            self._land(grad, i)
            return None
        done = self.env.event() if self.opt.blocking_p2p else None
        start = self.env.now

        def landed() -> None:
            if self.timeline is not None:
                self._record(r, "comm", f"send {'B' if grad else 'F'}{a.microbatch} {a.stage}->{dst}", start,
                             self.env.now, "p2p")
            self._land(grad, i)
            if done is not None:
                done.succeed()

        if self._on_cores:
            self._host_copy(r, phases).callbacks.append(lambda _e: landed())
        else:
            self.tr.run(phases, self._prio(True), landed)
        return done

    def _prefetch(self, nxt: Action, ahead: bool, now: Action) -> None:
        """vPipe-style swap-in of the next backward's activations while this action runs.

        ``ahead`` (:func:`~mindpipe.simulator.actions.prefetched_backward`): the backward follows
        another action, so its last swapped block is copied back under this one and the others
        during the backward, one ahead (``StageWork.swap_chain_s``); else it directly follows its
        own forward, whose bytes reach the host only after it (the executor's host→device copy
        waits for the device→host copy's event, ``executor/offload.py``), and all its swapped
        blocks come back before it, as it asks for them. Under a prefetched backward of the same
        stage (``now``: 1F1B's cool-down) the copy starts when that backward reaches its first
        swapped block (``StageWork.swap_lowest_s``), as the executor defers it. A lazy stage
        (``StageWork.swap_lazy``) starts its copy back at the backward instead.
        """
        st = self.stages[nxt.stage]
        key = (nxt.stage, nxt.microbatch)
        if nxt.kind in ("B", "I") and st.swap_in and not st.swap_lazy and key not in self.swapped_in:
            if ahead:
                self._chained.add(key)
            phases = st.swap_in if ahead else st.swap_in + st.swap_chain_in
            under = now.stage == nxt.stage and (now.stage, now.microbatch) in self._chained and now.kind in ("B", "I")
            self.swapped_in[key] = self.env.process(
                self._swap_back(self.schedule.stage_to_rank[nxt.stage], phases, self._swap_out_event(key), nxt,
                                st.swap_lowest_s if ahead and under else 0.0))

    def _swap_out_event(self, key: tuple[int, int]) -> simpy.Event:
        """The event of ``key``'s copy to the host landing (made by whichever side asks first)."""
        ev = self._swapped_out.get(key)
        if ev is None:
            ev = self._swapped_out[key] = self.env.event()
        return ev

    def _swap_out_head(self, r: int, st: StageWork, a: Action, forward_end: float):
        """The copy out of the stage's swapped blocks but the last, from ``swap_stream_s`` before the
        forward's compute ends (:func:`~mindpipe.simulator.work.swap_stream_window_s`)."""
        if (wait := forward_end - st.swap_stream_s - self.env.now) > 0.0:
            yield self.env.timeout(wait)
        yield from self._comm(r, st.swap_out, f"swap-out {a}", "swap", False)

    def _swap_out(self, r: int, phases: list[Phase], a: Action, head: simpy.Process | None):
        """The last swapped block's copy out, after the forward and after the rest of the stage's
        (one direction of the link, in order); then the copy back may start."""
        if head is not None and not head.processed:
            yield head
        yield from self._comm(r, phases, f"swap-out {a}", "swap", False)
        self._swap_out_event((a.stage, a.microbatch)).succeed()

    def _swap_back(self, r: int, phases: list[Phase], out: simpy.Event, nxt: Action, delay: float = 0.0):
        """The copy back of ``nxt``'s swapped activations, ``delay`` from now and once their copy
        out has landed (on the timeline as ``swap-in``, beside the copies out)."""
        if delay > 0.0:
            yield self.env.timeout(delay)
        if not out.processed:
            yield out
        yield from self._comm(r, phases, f"swap-in {nxt}", "swap", False)

    def _comm(self, r: int, phases: list[Phase], label: str, cat: str, pp_traffic: bool):
        start = self.env.now
        yield self._transfer(None, phases, pp_traffic)
        self._record(r, "comm", label, start, self.env.now, cat)

    def _reduce_grads(self, r: int, s: int, t0: float, duration: float):
        """Issue stage ``s``'s gradient buckets as the last backward produces them."""
        env = self.env
        buckets = self.stages[s].dp_buckets
        n = len(buckets)
        for k, phases in enumerate(buckets):
            # FSDP2 reducing in every backward issues each module's reduce-scatter as its gradients
            # are produced, as overlap_grad_reduce does.
            if self.opt.overlap_grad_reduce or self.stages[s].reduce_every_backward:
                ready = t0 + duration * (k + 1) / n
                if env.now < ready:
                    yield env.timeout(ready - env.now)
            elif not self.compute_done[r].processed:
                yield self.compute_done[r]
            start = env.now
            yield self._transfer(r, phases)
            yield from self._peer_wait(phases)
            if self.timeline is not None:
                self._record(r, "comm", f"grad-reduce stage {s} bucket {k}", start, env.now, "dp")

    def _gather(self, r: int, s: int, units: list[list[Phase]], first: int = 0):
        """All-gather stage ``s``'s sharded modules one after another, on rank ``r``'s links
        (``first``: the index of ``units[0]`` among the stage's units, for the timeline)."""
        for k, phases in enumerate(units, start=first):
            start = self.env.now
            yield self._transfer(r, phases)
            yield from self._peer_wait(phases)
            if self.timeline is not None:
                self._record(r, "comm", f"param-gather stage {s} unit {k}", start, self.env.now, "dp")

    def _peer_wait(self, phases: list[Phase]):
        """On a host's shared cores, the wall time a blocking collective outside the actions'
        tensor-parallel ones (data-parallel reductions and gathers, the norms' gradient
        all-reduce) waits for its peers after its host copies (``LinkCalibration.tp_wait_s``, as
        for those: gloo blocks the issuing thread until every peer has joined); nothing on
        dedicated devices or without a fitted wait."""
        if self._on_cores and (wait := sum(map(self.tr.phase_wait_s, phases))) > 0:
            yield self.env.timeout(wait)

    def _gather_ahead(self, r: int, s: int, units: list[list[Phase]]):
        """Gather stage ``s``'s sharded modules before an action: all of them on CPU ranks sharing
        cores; on dedicated devices only the first, and the others one after another under the
        action's compute (FSDP2's prefetch: the next unit's all-gather is issued while the device
        computes the current one). Returns (the process gathering the rest, the number of units),
        or None when nothing is left in flight."""
        if not self._prefetch_gathers or len(units) == 1:
            yield from self._gather(r, s, units)
            return None
        yield from self._gather(r, s, units[:1])
        return self.env.process(self._gather_rest(r, s, units[1:])), len(units)

    def _gather_rest(self, r: int, s: int, units: list[list[Phase]]):
        """Gather ``units`` (a stage's units from its second on) in order; returns when the last one landed."""
        yield from self._gather(r, s, units, first=1)
        return self.env.now

    def _gather_params(self, r: int, s: int):
        """The stage's first gather of the step: ready for its first forward once the first unit
        has landed on dedicated devices (the rest is prefetched under that forward), else all."""
        units = self.stages[s].gather_buckets
        if self._prefetch_gathers and len(units) > 1:
            yield from self._gather(r, s, units[:1])
            self._params_rest[s] = self.env.process(self._gather_rest(r, s, units[1:]))
        else:
            yield from self._gather(r, s, units)
        self.params_ready[s].succeed()

    def run(self) -> EngineResult:
        """Simulate the iteration and return its times."""
        env = self.env
        pp = self.schedule.pp
        for s, st in enumerate(self.stages):
            if st.gather_buckets:
                env.process(self._gather_params(self.schedule.stage_to_rank[s], s))
        rank_procs = []
        for r in range(pp):
            rank_procs.append(env.process(self._rank(r)))
        for r in range(pp):
            env.process(self._finish(r))
        env.run()
        for r, p in enumerate(rank_procs):
            if not p.processed:
                raise RuntimeError(f"deadlock: rank {r} never finished its schedule (waiting on a transfer)")
        pipeline = max(self.last_compute_end) if pp else 0.0
        moved = self._solo_bytes()
        for link_type, nbytes in self.net.bytes_by_link_type.items():
            moved[link_type] = moved.get(link_type, 0.0) + nbytes
        return EngineResult(
            iteration_time_s=max(self.end),
            pipeline_time_s=pipeline,
            busy_s=list(self.busy),
            compute_s=list(self.compute),
            end_s=list(self.end),
            exposed_dp_s=list(self.exposed_dp),
            comm_busy_s=list(self.comm_busy),
            bytes_by_link_type=moved,
            timeline=self.timeline,
        )

    def _finish(self, r: int):
        """Wait for the rank's schedule, then for its gradient reductions, then step."""
        env = self.env
        yield self.compute_done[r]
        t_compute = env.now
        # Reductions were spawned during the schedule; they finish by succeeding their processes.
        for p in self._dp_waiters[r]:
            if p.processed:
                continue
            yield p
        self.exposed_dp[r] = env.now - t_compute
        work = self.ranks[r]
        if work.partial_grad_reduce:
            start, alone = env.now, self._solo_partial[r]
            yield env.timeout(alone) if alone is not None else self._transfer(r, work.partial_grad_reduce)
            yield from self._peer_wait(work.partial_grad_reduce)
            self._record(r, "comm", "norm gradients all-reduce", start, env.now, "tp")
        if work.tied_exchange and work.tied_peer is not None:
            # The tied table's all-reduce between the two pipeline ranks: both must be there.
            self._tied_ready[r].succeed()
            yield self._tied_ready[work.tied_peer]
            start = env.now
            yield self._transfer(r, work.tied_exchange)
            self._record(r, "comm", "tied table all-reduce", start, env.now, "pp")
        if work.optimizer_s > 0:
            start = env.now
            yield self._compute(r, work.optimizer_s)
            self._record(r, "compute", "optimizer", start, env.now, "optimizer")
        first_done = None
        for k, phases in enumerate(work.param_gather):
            start = env.now
            yield self._transfer(r, phases)
            yield from self._peer_wait(phases)
            first_done = env.now if k == 0 else first_done
            if self.timeline is not None:
                self._record(r, "comm", f"param-gather bucket {k}", start, env.now, "dp")
        # overlap_param_gather (Megatron --overlap-param-gather): the next iteration's forward waits
        # only for the first bucket; the later ones arrive while it computes, so in the steady state
        # an iteration pays the first bucket and what the rank's forward of one micro-batch (its
        # stages' F, the window before the last bucket is needed) cannot cover.
        hidden = 0.0
        if self.opt.overlap_param_gather and first_done is not None:
            window = sum(self.stages[s].forward_s for s in self.schedule.stages_of_rank(r))
            hidden = min(env.now - first_done, window)
        gap = self._overhead_slices(r)
        if gap is not None:
            yield from self._overhead(r, *gap)
        self.end[r] = env.now - hidden

    def _overhead_slices(self, r: int) -> tuple[float, float] | None:
        """(host CPU, wall) seconds of one overhead slice of rank ``r``: its per-iteration
        ``step_host_s`` and ``step_overhead_s`` split over its actions plus one after the step."""
        host, wall = self.opt.step_host_s, self.opt.step_overhead_s
        if host <= 0 and wall <= 0:
            return None
        slices = len(self.schedule.orders[r]) + 1
        return host / slices, wall / slices

    def _overhead(self, r: int, host: float, wall: float):
        """One overhead slice: host CPU work on the shared cores, then host time outside them."""
        start = self.env.now
        if host > 0:
            yield self._compute(r, host)
        if wall > 0:
            yield self.env.timeout(wall)
        if self.timeline is not None:
            self._record(r, "compute", "overhead", start, self.env.now, "overhead")


# The records are re-exported: build_work and the Simulator import them from here.
__all__ = ["Engine", "EngineOptions", "EngineResult", "RankWork", "StageWork", "TimelineEvent"]
