"""Context switching (NASPipe): only the candidates of the subnets in flight stay on the device.

A stage holds every candidate of its choice layers, but a subnet uses one per layer. With
switching on, a candidate's parameters and its optimizer state live in a host pool until a subnet
that chose it is about to run its forward on this stage, and go back when the last in-flight subnet
using it has applied its update (BACKGROUND.md §5). The parameters keep their identity (the
optimizer refers to them): only ``param.data`` and the optimizer's state tensors move.

* CUDA: the pool is pinned host memory; copies are ``non_blocking`` on a side stream, so the subnet
  of the stage's next forward is prefetched from the previous forward on, under whatever actions
  come between (NASPipe's one subnet ahead, as the simulator times it); an action waits on the
  copy's event before using the weights.
* CPU: host and device are the same RAM, so the pool keeps the tensors themselves and the
  parameter is left holding an empty tensor. What is resident is what the parameters hold, which
  is what the measurement counts (the host pool is not device memory, as in
  :mod:`mindpipe.executor.offload`).

With switching off every candidate is resident from the start; the class then only measures.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch
from torch import nn


def _bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


class ContextSwitcher:
    """Where each candidate of one stage waits, and how many bytes are resident.

    Args:
        modules: Candidate key → module (every candidate of the stage).
        always: Modules resident for the whole run (shared parts).
        optimizer: The stage's optimizer (its per-parameter state moves with the parameter).
        device: The stage's device.
        enabled: Switching on; off keeps everything resident.
    """

    def __init__(self, modules: dict[str, nn.Module], always: Iterable[nn.Module], optimizer: torch.optim.Optimizer,
                 device: torch.device, enabled: bool) -> None:
        self.modules, self.optimizer, self.device, self.enabled = modules, optimizer, device, enabled
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda and enabled else None
        self._host: dict[tuple[int, str], torch.Tensor] = {}  # (id of the slot, name) → host copy
        self._ready: dict[str, torch.cuda.Event] = {}
        self.resident: set[str] = set(modules) if not enabled else set()
        self._always = [p for m in always for p in m.parameters()]
        self.peak_param_bytes = 0
        self.peak_state_bytes = 0
        # Per candidate: parameter bytes (fixed) and optimizer-state bytes (known once it has stepped),
        # so measuring after every action costs a sum over the resident keys, not over tensors.
        self._param_bytes = {k: sum(_bytes(p.data) for p in m.parameters()) for k, m in modules.items()}
        self._always_bytes = sum(_bytes(p.data) for p in self._always)
        self.total_param_bytes = sum(self._param_bytes.values()) + self._always_bytes
        self._state_bytes = {k: self._tensor_state(m.parameters()) for k, m in modules.items()}  # resumed state
        if enabled:
            for key in modules:
                self._evict(key)
        self.measure()

    def _slots(self, key: str) -> list[tuple[dict[str, torch.Tensor] | nn.Parameter, str]]:
        """Every tensor slot of a candidate: each parameter's ``data`` and its optimizer-state tensors."""
        slots: list[tuple[dict[str, torch.Tensor] | nn.Parameter, str]] = []
        for p in self.modules[key].parameters():
            slots.append((p, "data"))
            state = self.optimizer.state.get(p)
            if state:
                slots += [(state, name) for name, v in state.items() if isinstance(v, torch.Tensor) and v.dim() > 0]
        return slots

    @staticmethod
    def _get(slot: dict[str, torch.Tensor] | nn.Parameter, name: str) -> torch.Tensor:
        return slot.data if isinstance(slot, nn.Parameter) else slot[name]

    @staticmethod
    def _set(slot: dict[str, torch.Tensor] | nn.Parameter, name: str, t: torch.Tensor) -> None:
        if isinstance(slot, nn.Parameter):
            slot.data = t
        else:
            slot[name] = t

    def _evict(self, key: str) -> None:
        for slot, name in self._slots(key):
            t = self._get(slot, name)
            if self.cuda:
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                host.copy_(t)  # synchronous: the update that wrote t is done before t is dropped
            else:
                host = t
            self._host[(id(slot), name)] = host
            self._set(slot, name, torch.empty(0, dtype=t.dtype, device=self.device))
        self.resident.discard(key)

    def _load(self, key: str) -> None:
        stream = self.stream
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for slot, name in self._slots(key):
                host = self._host.pop((id(slot), name))
                self._set(slot, name, host.to(self.device, non_blocking=True) if self.cuda else host)
        if stream is not None:
            ev = torch.cuda.Event()
            ev.record(stream)
            self._ready[key] = ev
        self.resident.add(key)

    def fetch(self, keys: Iterable[str]) -> None:
        """Start bringing ``keys`` to the device (a prefetch on CUDA; immediate on CPU)."""
        if not self.enabled:
            return
        for key in keys:
            if key not in self.resident:
                self._load(key)
        self.measure()

    def ready(self, keys: Iterable[str]) -> None:
        """Make ``keys`` resident and usable by the current stream (waits on a prefetch)."""
        self.fetch(keys)
        for key in keys:
            ev = self._ready.pop(key, None)
            if ev is not None:
                torch.cuda.current_stream(self.device).wait_event(ev)

    def release(self, keep: set[str]) -> None:
        """Send every resident candidate not in ``keep`` back to the host pool."""
        if not self.enabled:
            return
        for key in sorted(self.resident - keep):
            self._evict(key)

    def _tensor_state(self, params: Iterable[nn.Parameter]) -> int:
        return sum(_bytes(p.grad) + sum(_bytes(v) for v in self.optimizer.state.get(p, {}).values()
                                        if isinstance(v, torch.Tensor) and v.dim() > 0) for p in params)

    def measure(self, stepped: Iterable[str] = ()) -> None:
        """Update the peaks of resident parameter bytes and of model state (parameters, grads, optimizer state).

        ``stepped``: candidates whose gradients are live and whose optimizer just stepped (their
        state bytes are read again, their gradients counted).
        """
        grads = 0
        for key in stepped:
            params = list(self.modules[key].parameters())
            self._state_bytes[key] = self._tensor_state(params) - sum(_bytes(p.grad) for p in params)
            grads += sum(_bytes(p.grad) for p in params)
        pbytes = sum(self._param_bytes[k] for k in self.resident) + self._always_bytes
        state = sum(self._state_bytes[k] for k in self.resident) + grads + self._tensor_state(
            p for p in self._always if p.requires_grad)
        self.peak_param_bytes = max(self.peak_param_bytes, pbytes)
        self.peak_state_bytes = max(self.peak_state_bytes, pbytes + state)

    def restore_all(self) -> None:
        """Bring every candidate back (before a checkpoint or at the end)."""
        if self.enabled:
            for key in self.modules:
                if key not in self.resident:
                    self._load(key)
            if self.cuda:
                torch.cuda.synchronize(self.device)
            self._ready.clear()

    def evict_all(self) -> None:
        """After a checkpoint: back to nothing resident."""
        self.release(set())


__all__ = ["ContextSwitcher"]
