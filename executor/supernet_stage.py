"""One pipeline stage of a supernet run: run its order of a subnet schedule, update per subnet.

The stage runs ``schedule.orders[s]`` (:func:`~mindpipe.simulator.subnet_schedules.build_subnet_schedule`,
the one schedule implementation) action by action:

* ``F(b)``: the input is subnet b's tokens (first stage) or the activation stage s−1 sent; the
  stage runs b's chosen candidates and sends the output on (``isend``), or, on the last stage,
  computes b's loss.
* ``B(b)``: the output gradient comes from stage s+1 (or the loss); the input gradient goes back to
  s−1 (``isend``). Then (update ``each_backward``) the data-parallel group all-reduces the
  gradients of b's chosen candidates on this stage (summed, divided by dp: the gradient of the
  mean loss), the optimizer steps exactly those parameters (torch skips parameters whose
  ``.grad`` is None) and the gradients are set to None. ``batch_end`` (``sync``) does that once,
  after the batch's last backward. There is no global gradient-norm clipping: it would couple the
  stages' updates through a norm over all of them, and CSP's point is that they are independent.

**Receives follow the sender's order.** CSP may run forwards out of subnet order, and two stages
may order them differently; NCCL matches p2p messages in issue order and ignores tags. Every rank
knows the whole table, so a receiver takes messages in the order its neighbour sends them
(stage s−1's forwards, stage s+1's backwards) and keeps any that arrive before they are needed.
This is deadlock-free: each order is one topological order of the dependency graph.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from mindpipe.executor.measure import action_cpu_clock
from mindpipe.executor.payload import ActionSpan, CommSpan, OptimizerSpan, Spans
from mindpipe.executor.supernet_switch import ContextSwitcher
from mindpipe.simulator.subnet_schedules import SubnetSchedule
from mindpipe.traces.supernet import Choices
from mindpipe.traces.torch_supernet import SupernetStage, candidate_key
from torch import nn


def make_optimizer(params: Iterable[nn.Parameter], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW, per-parameter loop (``foreach=False``): the same arithmetic however the parameters are grouped."""
    return torch.optim.AdamW(list(params), lr=lr, weight_decay=weight_decay, foreach=False)


def combine_losses(values: list[float]) -> float:
    """A subnet's loss: the float32 mean of its replicas' losses (in dp-rank order)."""
    return float(torch.tensor(values, dtype=torch.float32).mean())


def reduce_gradients(params: list[nn.Parameter], dp: int, all_reduce: Callable[[torch.Tensor], None] | None) -> None:
    """Sum the gradients over the dp replicas (``all_reduce`` of one flat buffer) and divide by dp."""
    grads = [p for p in params if p.grad is not None]
    if dp == 1 or not grads:
        return
    if all_reduce is not None:
        flat = torch.cat([p.grad.reshape(-1) for p in grads])  # type: ignore[union-attr]
        all_reduce(flat)
        offset = 0
        for p in grads:
            n = p.numel()
            p.grad = flat[offset:offset + n].view_as(p)
            offset += n
    for p in grads:
        p.grad.div_(dp)  # type: ignore[union-attr]


def _diff(c0: float | None, c1: float | None) -> float | None:
    return None if c0 is None or c1 is None else c1 - c0


class StageLinks:
    """Point-to-point links of one stage to its pipeline neighbours, receiving in the senders' order."""

    def __init__(self, prev_rank: int | None, next_rank: int | None, shape: tuple[int, ...], device: torch.device,
                 spans: Spans, origin: float) -> None:
        self.prev, self.next, self.shape, self.device = prev_rank, next_rank, shape, device
        self.spans, self.origin = spans, origin
        self.pending: list[Any] = []
        self._buffers: dict[tuple[str, int], torch.Tensor] = {}
        self._sequence: dict[str, list[int]] = {}
        self._cursor: dict[str, int] = {}

    def expect(self, kind: str, order: list[int]) -> None:
        """The subnet ids the neighbour sends for ``kind`` (``act`` from s−1, ``grad`` from s+1), in its order."""
        self._sequence[kind], self._cursor[kind] = order, 0

    def send(self, kind: str, tensor: torch.Tensor) -> None:
        """Send an activation forward (``act``) or a gradient back (``grad``), without waiting."""
        dst = self.next if kind == "act" else self.prev
        self.pending.append((dist.isend(tensor.contiguous(), dst), tensor))
        self.pending = [w for w in self.pending if not w[0].is_completed()]

    def recv(self, kind: str, subnet: int, step: int) -> torch.Tensor:
        """The tensor of ``subnet`` (receiving, in order, any the neighbour sent before it)."""
        src = self.prev if kind == "act" else self.next
        t0 = time.perf_counter()
        while (kind, subnet) not in self._buffers:
            seq, i = self._sequence[kind], self._cursor[kind]
            buf = torch.empty(self.shape, device=self.device)
            dist.recv(buf, src)
            self._buffers[(kind, seq[i])] = buf
            self._cursor[kind] = i + 1
        t1 = time.perf_counter()
        self.spans.comms.append(CommSpan(step, "p2p_wait", "pp", "recv", t0 - self.origin, t1 - self.origin))
        return self._buffers.pop((kind, subnet))

    def drain(self) -> None:
        """Wait for every send (at a segment's end)."""
        for work, _ in self.pending:
            work.wait()
        self.pending = []


class StageRunner:
    """Runs one stage's order of a subnet schedule (see module docstring).

    Args:
        module: The stage's :class:`~mindpipe.traces.torch_supernet.SupernetStage`.
        stage, num_stages, dp_rank, dp: Where the rank sits.
        optimizer, switcher, links: Its optimizer, context switcher and p2p links.
        batch_fn: ``batch_fn(subnet) -> (inputs, targets)``: this replica's rows of the subnet's batch.
        all_reduce: Sums a flat gradient buffer over the dp group (None when dp is 1).
        spans, origin: Where timings go, and the run's time origin.
    """

    def __init__(self, module: SupernetStage, stage: int, num_stages: int, dp: int, optimizer: torch.optim.Optimizer,
                 switcher: ContextSwitcher, links: StageLinks,
                 batch_fn: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
                 all_reduce: Callable[[torch.Tensor], None] | None, spans: Spans, origin: float) -> None:
        self.module, self.stage, self.num_stages, self.dp = module, stage, num_stages, dp
        self.optimizer, self.switcher, self.links = optimizer, switcher, links
        self.batch_fn, self.all_reduce, self.spans, self.origin = batch_fn, all_reduce, spans, origin
        self.losses: dict[int, float] = {}
        self.on_loss: Callable[[int, float], None] | None = None  # told each subnet's loss (progress)
        self.cuda = switcher.cuda

    def _keys(self, choices: Choices) -> list[str]:
        return [candidate_key(layer, choices[layer]) for layer in self.module.layers]

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - self.origin

    def run(self, schedule: SubnetSchedule, first_id: int, choices: list[Choices]) -> None:
        """Run this stage's order for subnets ``first_id ..`` (local index b is subnet ``first_id + b``)."""
        s, orders = self.stage, schedule.orders
        if s > 0:
            self.links.expect("act", [first_id + a.microbatch for a in orders[s - 1] if a.kind == "F"])
        if s < self.num_stages - 1:
            self.links.expect("grad", [first_id + a.microbatch for a in orders[s + 1] if a.kind == "B"])
        order = orders[s]
        held: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        in_flight: dict[int, list[str]] = {}
        touched: list[nn.Parameter] = []
        batch_keys: set[str] = set()
        # The next forward after each action: its candidates are prefetched from the previous forward on
        # (NASPipe's one subnet ahead; what mindpipe.simulator.subnet_replay times and subnet_memory counts).
        next_f: list[int | None] = [None] * len(order)
        ahead: int | None = None
        for i in range(len(order) - 1, -1, -1):
            next_f[i] = ahead
            if order[i].kind == "F":
                ahead = order[i].microbatch
        for i, a in enumerate(order):
            sid = first_id + a.microbatch
            ch = choices[a.microbatch]
            nf = next_f[i]
            upcoming = self._keys(choices[nf]) if nf is not None else []
            if a.kind == "F":
                in_flight[sid] = self._keys(ch)
                self.switcher.ready(in_flight[sid])
                held[sid] = self._forward(sid, ch)
            else:
                self._backward(sid, *held.pop(sid))
                params = [p for m in self.module.chosen(ch) for p in m.parameters() if p.grad is not None]
                touched += params
                batch_keys.update(self._keys(ch))
                end_of_batch = schedule.update == "each_backward" or (a.microbatch + 1) % schedule.batch == 0
                if end_of_batch:
                    self._update(sid, touched, batch_keys)
                    touched, batch_keys = [], set()
                    done = [k for k in in_flight if k <= sid] if schedule.update == "batch_end" else [sid]
                    for k in done:
                        in_flight.pop(k, None)
                    keep = {key for keys in in_flight.values() for key in keys} | set(upcoming)
                    self.switcher.release(keep)
            self.switcher.fetch(upcoming)  # prefetch the next forward's candidates (already resident after a B)
        self.links.drain()

    def _forward(self, sid: int, ch: Choices) -> tuple[torch.Tensor | None, torch.Tensor]:
        first, last = self.stage == 0, self.stage == self.num_stages - 1
        x_in: torch.Tensor | None = None
        tokens, target = self.batch_fn(sid) if first or last else (None, None)
        if first:
            x = tokens
        else:
            x_in = self.links.recv("act", sid, sid + 1).requires_grad_(True)
            x = x_in
        t0, c0 = self._now(), action_cpu_clock(self.cuda)
        out = self.module(x, ch)
        if last:
            out = self.module.loss(out, target)  # type: ignore[arg-type]
            self.losses[sid] = float(out.detach())
            if self.on_loss is not None:
                self.on_loss(sid, self.losses[sid])
        c1, t1 = action_cpu_clock(self.cuda), self._now()
        self.spans.actions.append(ActionSpan(sid + 1, self.stage, sid, "F", t0, t1, _diff(c0, c1)))
        if not last:
            self.links.send("act", out.detach())
        return x_in, out

    def _backward(self, sid: int, x_in: torch.Tensor | None, out: torch.Tensor) -> None:
        last = self.stage == self.num_stages - 1
        grad = None if last else self.links.recv("grad", sid, sid + 1)
        t0, c0 = self._now(), action_cpu_clock(self.cuda)
        torch.autograd.backward(out, grad)
        c1, t1 = action_cpu_clock(self.cuda), self._now()
        self.spans.actions.append(ActionSpan(sid + 1, self.stage, sid, "B", t0, t1, _diff(c0, c1)))
        if x_in is not None:
            self.links.send("grad", x_in.grad)  # type: ignore[arg-type]

    def _update(self, sid: int, params: list[nn.Parameter], keys: set[str]) -> None:
        t0 = self._now()
        reduce_gradients(params, self.dp, self.all_reduce)
        t1 = self._now()
        if self.dp > 1:
            self.spans.comms.append(CommSpan(sid + 1, "dp_sync", "dp", "allreduce", t0, t1, group_size=self.dp))
        self.optimizer.step()
        self.switcher.measure(keys)  # gradients and the updated candidates' optimizer state are live now
        self.optimizer.zero_grad(set_to_none=True)
        self.spans.optimizer.append(OptimizerSpan(sid + 1, t1, self._now()))


__all__ = ["StageLinks", "StageRunner", "combine_losses", "make_optimizer", "reduce_gradients"]
