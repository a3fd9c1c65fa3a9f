"""Swap: a block's saved activations leave the device after its forward and come back for its backward.

vPipe's third per-layer choice (Zhao et al., TPDS'21; BACKGROUND.md §4.2), the ``swap`` block
policy of :func:`mindpipe.traces.layout.block_policies`. While a swapped block runs its forward,
:func:`swapping` installs ``torch.autograd.graph.saved_tensors_hooks`` whose pack hook copies
every tensor autograd saves into a :class:`HostPool` and whose unpack hook copies it back when the
backward needs it. The device keeps nothing of the block between its forward and its backward;
the copies brought back live only until the backward that asked for them is done.

* **CUDA**: the pool is pinned host memory; the device→host copy runs on a side stream, after
  the producing kernels (the side stream waits on the compute stream), and the source's memory
  is held for that stream (``record_stream``) so the allocator does not reuse it before the copy
  ends. The host→device copy waits for that copy's event and runs on the compute stream
  (``non_blocking``: pinned memory makes it asynchronous). This is
  ``torch.autograd.graph.save_on_cpu(pin_memory=True)`` with the copy out moved off the
  compute stream.
* **Prefetch** (:func:`install_prefetch`): a backward that does not directly follow its own
  forward gets its micro-batch's swapped tensors copied back while the action before it runs
  (:func:`mindpipe.simulator.actions.prefetched_backward`, the rule the engine times and the memory
  model counts). On CUDA the copy runs on a second side stream (host→device; PCIe is full duplex),
  after the copy out's event; the backward's unpack waits for it and the copy is held for the
  compute stream. The copies stay with their saved tensors until the backward action that used
  them ends (a B releases its saved tensors anyway; an I keeps its graph for W, and W brings back
  what it needs tensor by tensor). A backward right after its own forward copies back as it asks.
* **CPU**: "device" and host are the same RAM, so the pool is a separate set of copies that the
  rank's device accounting (:mod:`mindpipe.executor.memory_account`) does not count: the saved
  tensor's own storage is no longer held by autograd, exactly as on a GPU. The pool's bytes are
  reported on their own (``host_pool_peak_bytes``).

Values are copied bit for bit both ways, so a swapped run trains to the same losses as a kept one.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from mindpipe.simulator.actions import Action, prefetched_backward


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (tensor parallelism saves DTensors), else ``t`` itself."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


def is_weight(t: torch.Tensor) -> bool:
    """A parameter, or a view of one (a layer saves its weight for backward): not an activation."""
    return isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter)


def host_buffer(t: torch.Tensor, pin: bool) -> torch.Tensor:
    """An empty host tensor for ``t``'s copy, laid out as ``t`` is: its strides are kept where ``t`` is
    dense and non-overlapping (``torch.empty_like``'s ``preserve_format``; a transposed view stays
    transposed), else contiguous. The copy back (``Tensor.to``) keeps them too. A compiled backward
    (inductor, e.g. the fp8 path's compiled linears) asserts the strides of the tensors it saved: a
    contiguous copy of a transposed one failed it on an H200 (2026-12-04)."""
    return torch.empty_like(t, device="cpu", pin_memory=pin)


class _Swapped:
    """One saved tensor in the pool; its bytes leave the pool when autograd releases it. ``back`` is
    the device copy a prefetch made (``landed`` its event on CUDA), until the backward is done."""

    __slots__ = ("__weakref__", "back", "done", "host", "landed", "pool", "spec")

    def __init__(self, pool: HostPool, host: torch.Tensor, done: Any, spec: tuple[Any, ...] | None = None) -> None:
        self.pool, self.host, self.done, self.spec = pool, host, done, spec
        self.back: torch.Tensor | None = None
        self.landed: Any = None
        pool.add(host.numel() * host.element_size())

    def __del__(self) -> None:
        self.pool.add(-(self.host.numel() * self.host.element_size()))


class HostPool:
    """Host memory holding swapped activations, counted apart from the device's memory.

    Attributes:
        live_bytes: Bytes in the pool now.
        peak_bytes: Most bytes the pool held at once.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # Tensors packed in the running block forward: (storage, offset, shape, stride, dtype) ->
        # (the tensor, its copy); a tensor saved by several ops is copied once.
        self.packed: dict[tuple[Any, ...], tuple[weakref.ref[torch.Tensor], _Swapped]] = {}
        self.cuda = device.type == "cuda"
        self.stream: Any = torch.cuda.Stream(device) if self.cuda else None
        self.in_stream: Any = torch.cuda.Stream(device) if self.cuda else None  # the prefetch's copies back
        self.live_bytes = 0
        self.peak_bytes = 0
        # The (stage, micro-batch) whose forward runs now, and what each forward swapped (install_prefetch).
        self.group: tuple[int, int] | None = None
        self.groups: dict[tuple[int, int], list[weakref.ref[_Swapped]]] = {}
        self.fetched: dict[tuple[int, int], list[weakref.ref[_Swapped]]] = {}

    def add(self, nbytes: int) -> None:
        """Account ``nbytes`` entering (or, negative, leaving) the pool."""
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def pack(self, t: torch.Tensor) -> _Swapped | torch.Tensor:
        """Copy ``t`` into the pool (module docstring: side stream and pinned memory on CUDA).

        Weights stay where they are (they are on the device anyway).
        """
        if is_weight(t):
            return t
        local = local_tensor(t)
        key = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(t.shape), t.stride(), local.stride(),
               t.dtype, local.device)
        seen = self.packed.get(key)
        if seen is not None and seen[0]() is not None:  # alive: the same memory, not a reuse of it
            return seen[1]
        s = self._copy(t)
        self.packed[key] = (weakref.ref(t), s)
        if self.group is not None:
            self.groups.setdefault(self.group, []).append(weakref.ref(s))
        return s

    def prefetch(self, group: tuple[int, int], on_fetch: Callable[[torch.Tensor], None] | None = None) -> int:
        """Start copying back everything the forward of ``group`` (stage, micro-batch) swapped
        (module docstring); returns the bytes brought back. ``on_fetch`` sees each copy."""
        nbytes = 0
        fetched = self.fetched.setdefault(group, [])
        for ref in self.groups.pop(group, []):
            s = ref()
            if s is None or s.back is not None:
                continue
            if s.done is None:
                s.back = s.host.clone()
            else:
                with torch.cuda.stream(self.in_stream):
                    self.in_stream.wait_event(s.done)
                    s.back = s.host.to(self.device, non_blocking=True)
                    s.landed = self.in_stream.record_event()
            nbytes += s.back.numel() * s.back.element_size()
            fetched.append(ref)
            if on_fetch is not None:
                on_fetch(s.back)
        return nbytes

    def release(self, group: tuple[int, int]) -> None:
        """Drop the prefetched copies of ``group`` still held (after its backward action), and what
        its forward filed if nothing prefetched it (a backward right after its own forward)."""
        self.groups.pop(group, None)
        for ref in self.fetched.pop(group, []):
            s = ref()
            if s is not None:
                s.back, s.landed = None, None

    def _copy(self, t: torch.Tensor) -> _Swapped:
        if not self.cuda or t.device.type != "cuda":
            return _Swapped(self, t.detach().clone(), None)
        local = local_tensor(t)  # a DTensor's shard goes to the host; unpack rebuilds the DTensor around it
        spec = None if local is t else (t.device_mesh, t.placements, t.shape, t.stride())  # type: ignore[attr-defined]
        host = host_buffer(local, pin=True)
        compute = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            host.copy_(local, non_blocking=True)
        local.record_stream(self.stream)
        return _Swapped(self, host, self.stream.record_event(), spec)

    def unpack(self, s: _Swapped | torch.Tensor) -> torch.Tensor:
        """The tensor back on the device (a fresh copy; the pool keeps its own until released)."""
        if isinstance(s, torch.Tensor):
            return s
        if s.back is not None and s.landed is None:  # prefetched on a CPU
            return s.back
        if s.done is None:
            return s.host.clone()
        compute = torch.cuda.current_stream(self.device)
        if s.back is not None:  # prefetched: wait for its copy, and hold its memory for this stream
            compute.wait_event(s.landed)
            back = s.back
            back.record_stream(compute)
        else:
            compute.wait_event(s.done)
            back = s.host.to(self.device, non_blocking=True)
        if s.spec is None:
            return back
        from torch.distributed.tensor import DTensor

        mesh, placements, shape, stride = s.spec
        return DTensor.from_local(back, mesh, placements, run_check=False, shape=shape, stride=stride)


@contextlib.contextmanager
def swapping(pool: HostPool, on_unpack: Callable[[torch.Tensor], None] | None = None) -> Iterator[None]:
    """Send every tensor saved for backward inside the block to ``pool``.

    ``on_unpack`` sees each tensor brought back (the device accounting counts it as transient).
    """

    def unpack(s: _Swapped | torch.Tensor) -> torch.Tensor:
        t = pool.unpack(s)
        if on_unpack is not None and isinstance(s, _Swapped):
            on_unpack(t)
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pool.pack, unpack):
            yield
    finally:
        pool.packed.clear()


def install_prefetch(stages: Sequence[Any], pool: HostPool, order: Sequence[Action], swapped: set[int],
                     on_fetch: Callable[[torch.Tensor], None] | None = None) -> None:
    """Run vPipe's prefetch on this rank's pipeline stages (module docstring).

    Wraps each stage's ``forward_one_chunk`` (what it swaps is filed under its (stage, micro-batch)),
    ``backward_one_chunk`` (B, or I with ``full_backward=False``: its copies are dropped when it
    ends) and ``backward_weight_one_chunk`` (W): as each action starts, the backward that
    :func:`~mindpipe.simulator.actions.prefetched_backward` names after it in ``order`` (the rank's
    actions, as the simulator times them) has its stage's swapped tensors copied back, if
    ``swapped`` holds that stage. An action ``order`` does not hold starts nothing.
    """
    index = {a: i for i, a in enumerate(order)}

    def ahead(a: Action) -> None:
        i = index.get(a)
        nxt = None if i is None else prefetched_backward(list(order), i)
        if nxt is not None and nxt.stage in swapped:
            pool.prefetch((nxt.stage, nxt.microbatch), on_fetch)

    for st in stages:
        s = st.stage_index
        fwd, bwd, bww = st.forward_one_chunk, st.backward_one_chunk, st.backward_weight_one_chunk

        def forward_one_chunk(mb: int, *args: Any, _run: Any = fwd, _s: int = s, **kwargs: Any) -> Any:
            ahead(Action(_s, "F", mb))
            pool.group = (_s, mb)
            try:
                return _run(mb, *args, **kwargs)
            finally:
                pool.group = None

        def backward_one_chunk(mb: int, *args: Any, _run: Any = bwd, _s: int = s, **kwargs: Any) -> Any:
            full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
            ahead(Action(_s, "B" if full else "I", mb))
            try:
                return _run(mb, *args, **kwargs)
            finally:
                pool.release((_s, mb))

        def backward_weight_one_chunk(mb: int, *args: Any, _run: Any = bww, _s: int = s, **kwargs: Any) -> Any:
            ahead(Action(_s, "W", mb))
            return _run(mb, *args, **kwargs)

        st.forward_one_chunk = forward_one_chunk
        st.backward_one_chunk = backward_one_chunk
        st.backward_weight_one_chunk = backward_weight_one_chunk


__all__ = ["HostPool", "host_buffer", "install_prefetch", "is_weight", "local_tensor", "swapping"]
