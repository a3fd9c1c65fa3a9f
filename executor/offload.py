"""Swap: a block's saved activations leave the device after its forward and come back for its backward.

vPipe's third per-layer choice (Zhao et al., TPDS'21; BACKGROUND.md §4.2), the ``swap`` block
policy of :func:`mindpipe.traces.layout.block_policies`. While a swapped block runs its forward,
:func:`swapping` installs ``torch.autograd.graph.saved_tensors_hooks`` whose pack hook copies
every tensor autograd saves into a :class:`HostPool` and whose unpack hook copies it back when the
backward needs it. The device keeps nothing of the block between its forward and its backward;
the copies brought back live only until the backward that asked for them is done.

The pool copies storages, not views: a saved tensor is copied with its whole storage (unless the
storage is more than :data:`WHOLE_STORAGE_RATIO` times its bytes, when it is copied alone), and
every other view of that storage the block saves shares the copy, both ways. Attention saves the
softmax's output through two views of one storage, and the pool used to copy it twice: 33 % more
bytes than the block keeps at h 1,024, s 512 without FlashAttention, 6 % with it (stop 63). A view
comes back with its own offset, shape and strides, so a compiled backward finds the layout it saved.

* **CUDA**: the pool is pinned host memory; the device→host copy runs on a side stream, after
  the producing kernels (the side stream waits on the compute stream), and the source's memory
  is held for that stream (``record_stream``) so the allocator does not reuse it before the copy
  ends. The host→device copy waits for that copy's event and runs on the compute stream
  (``non_blocking``: pinned memory makes it asynchronous). This is
  ``torch.autograd.graph.save_on_cpu(pin_memory=True)`` with the copy out moved off the
  compute stream.
* **Prefetch, one block ahead** (:func:`install_prefetch`): a backward that does not directly
  follow its own forward gets its micro-batch's last swapped block copied back while the action
  before it runs (:func:`mindpipe.simulator.actions.prefetched_backward`, the rule the engine times
  and the memory model counts). Then, as each swapped block's backward begins (its first saved
  tensor asked for), the next swapped block below it starts coming back
  (:func:`mindpipe.simulator.work.swap_chain_stall_s` prices the wait), so at most two of a
  micro-batch's swapped blocks are on the device at once. A backward right after its own forward
  gets nothing ahead and copies back storage by storage as it asks (the least memory).
  On CUDA these copies run on a second side stream (host→device; PCIe is full duplex), after the
  copy out's event; the unpack waits for them and the copy is held for the compute stream. A
  prefetched copy stays until the backward action ends, or until autograd has released every
  view of it (a B releases its saved tensors as it goes; an I keeps its graph for W, and W brings
  back what it needs as it asks).
* **CPU**: "device" and host are the same RAM, so the pool is a separate set of copies that the
  rank's device accounting (:mod:`mindpipe.executor.memory_account`) does not count: the saved
  tensor's own storage is no longer held by autograd, exactly as on a GPU. The pool's bytes are
  reported on their own (``host_pool_peak_bytes``).

Values are copied bit for bit both ways, so a swapped run trains to the same losses as a kept one.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

import torch
from mindpipe.simulator.actions import Action, prefetched_backward
from torch.distributed._functional_collectives import AsyncCollectiveTensor


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (tensor parallelism saves DTensors), else ``t`` itself; waited
    on if a functional collective still owes it.

    Under sequence parallelism a DTensor's local tensor can be an ``AsyncCollectiveTensor`` (the
    all-gather before a column-parallel GEMM, not yet waited on), a wrapper without storage of its
    own: asking its storage's address failed tp·pp runs with ``sequence_parallel`` at micro-batch 1
    on their second stage ("invalid python storage", in the memory account's pack hook)."""
    local = getattr(t, "_local_tensor", None)
    local = local if isinstance(local, torch.Tensor) else t
    return local.wait() if isinstance(local, AsyncCollectiveTensor) else local


def is_weight(t: torch.Tensor) -> bool:
    """A parameter, or a view of one (a layer saves its weight for backward): not an activation."""
    return isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter)


def host_buffer(t: torch.Tensor, pin: bool) -> torch.Tensor:
    """An empty host tensor for ``t``'s copy, laid out as ``t`` is: its strides are kept where ``t`` is
    dense and non-overlapping (``torch.empty_like``'s ``preserve_format``; a transposed view stays
    transposed), else contiguous. A compiled backward (inductor, e.g. the fp8 path's compiled
    linears) asserts the strides of the tensors it saved: a contiguous copy of a transposed one
    failed it on an H200 (2026-12-04)."""
    return torch.empty_like(t, device="cpu", pin_memory=pin)


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """All of ``t``'s storage as a 1-D ``uint8`` tensor (no copy)."""
    st = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(st, 0, (st.nbytes(),), (1,))


def _view(on: torch.Tensor, s: _Swapped) -> torch.Tensor:
    """The saved tensor ``s`` describes, laid out over the storage of ``on`` (its storage's copy)."""
    return torch.empty(0, dtype=s.dtype, device=on.device).set_(on.untyped_storage(), s.offset, s.shape, s.stride)


class _Stored:
    """The bytes of one storage (or of one saved tensor's copy) in the pool; every saved view of it
    shares them. Its bytes leave the pool when autograd has released every view. ``back`` is a
    prefetch's device copy, held until its backward action ends (``landed``: its event on CUDA,
    until the compute stream has waited for it); ``lazy`` the first view a backward asked for
    without one: the other views share its storage while it lives, as autograd uses it."""

    __slots__ = ("__weakref__", "back", "block", "done", "host", "landed", "lazy", "pool")

    def __init__(self, pool: HostPool, host: torch.Tensor, done: Any) -> None:
        self.pool, self.host, self.done = pool, host, done
        self.back: torch.Tensor | None = None
        self.landed: Any = None
        self.lazy: weakref.ref[torch.Tensor] | None = None
        # (stage, micro-batch) and the swapped block's index among its forward's swapped blocks
        self.block: tuple[tuple[int, int], int] | None = pool.file(self)
        pool.add(host.numel())

    def __del__(self) -> None:
        self.pool.add(-self.host.numel())


class _Swapped:
    """One saved tensor: a view (dtype, storage offset, shape, strides) of a :class:`_Stored`, and
    for a DTensor the spec its local shard is rebuilt with."""

    __slots__ = ("dtype", "offset", "shape", "spec", "store", "stride")

    def __init__(self, store: _Stored, view: torch.Tensor, spec: tuple[Any, ...] | None) -> None:
        self.store, self.spec = store, spec
        self.dtype, self.offset, self.shape, self.stride = view.dtype, view.storage_offset(), tuple(view.shape), view.stride()


# A saved tensor whose storage is at most this many times its own bytes is copied with its whole
# storage, which the other views of that storage then share (attention saves the softmax's output
# as two views of one storage); a view of a larger storage is copied alone.
WHOLE_STORAGE_RATIO = 2


class HostPool:
    """Host memory holding swapped activations, counted apart from the device's memory.

    Attributes:
        live_bytes: Bytes in the pool now.
        peak_bytes: Most bytes the pool held at once.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # Storages copied in the running block forward: (data pointer, device) -> (the first tensor
        # seen on it, its copy); a storage saved through several views is copied once. The tensor
        # being alive proves the pointer still names the same storage.
        self.stores: dict[tuple[int, torch.device], tuple[weakref.ref[torch.Tensor], _Stored]] = {}
        self.cuda = device.type == "cuda"
        self.stream: Any = torch.cuda.Stream(device) if self.cuda else None
        self.in_stream: Any = torch.cuda.Stream(device) if self.cuda else None  # the prefetch's copies back
        self.live_bytes = 0
        self.peak_bytes = 0
        # The (stage, micro-batch) whose forward runs now; what each forward swapped, per swapped
        # block in forward order; the blocks whose backward has begun; the prefetched copies each
        # backward holds (install_prefetch).
        self.group: tuple[int, int] | None = None
        # Set by install_prefetch: swap only inside a pipeline action (a stage's F), not in the
        # forward torch.distributed.pipelining runs once to infer shapes, whose graph it keeps
        # until its backward's metadata pass: what that forward saved stayed in the pool for the
        # whole run (one micro-batch's swapped bytes on top of the model's count, measured).
        self.actions_only = False
        self.blocks: dict[tuple[int, int], list[list[weakref.ref[_Stored]]]] = {}
        self.started: set[tuple[tuple[int, int], int]] = set()
        self.chained: set[tuple[int, int]] = set()  # prefetched groups: the rest come back one ahead
        # A prefetch asked for under a prefetched backward of the same stage (1F1B's cool-down), held
        # until that backward reaches its first swapped block: group -> (the group to prefetch then,
        # the callback that sees its copies).
        self.deferred: dict[tuple[int, int], tuple[tuple[int, int], Callable[[torch.Tensor], None] | None]] = {}
        self.fetched: dict[tuple[int, int], list[weakref.ref[_Stored]]] = {}

    def begin_block(self) -> None:
        """A swapped block's forward starts: what it saves is filed as its own block."""
        if self.group is not None:
            self.blocks.setdefault(self.group, []).append([])

    def file(self, store: _Stored) -> tuple[tuple[int, int], int] | None:
        """File ``store`` under the running forward's last swapped block; its place, or None."""
        if self.group is None or not self.blocks.get(self.group):
            return None
        blocks = self.blocks[self.group]
        blocks[-1].append(weakref.ref(store))
        return self.group, len(blocks) - 1

    def add(self, nbytes: int) -> None:
        """Account ``nbytes`` entering (or, negative, leaving) the pool."""
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def pack(self, t: torch.Tensor) -> _Swapped | torch.Tensor:
        """Copy ``t`` into the pool (module docstring: side stream and pinned memory on CUDA).

        Weights stay where they are (they are on the device anyway), as do host tensors and empty ones.
        """
        if is_weight(t) or (self.actions_only and self.group is None):
            return t
        local = local_tensor(t)
        storage = local.untyped_storage()
        if (self.cuda and local.device.type != "cuda") or storage.nbytes() == 0:
            return t
        spec = None if local is t else (t.device_mesh, t.placements, t.shape, t.stride())  # type: ignore[attr-defined]
        if storage.nbytes() > WHOLE_STORAGE_RATIO * local.numel() * local.element_size():
            store, buf = self._copy_alone(local)
            return _Swapped(store, buf, spec)
        key = (storage.data_ptr(), local.device)
        seen = self.stores.get(key)
        if seen is not None and seen[0]() is not None:  # alive: the same storage, not a reuse of it
            return _Swapped(seen[1], local, spec)
        store = self._copy(storage_bytes(local), local)
        # Watch the view's base, not the view: nn.Linear saves a 2-D view of its input made inside
        # the call, which dies with it, while the base (a norm's output that Llama's separate
        # Q, K, V or gate and up GEMMs each view again) lives on; watching the view copied that
        # storage once per GEMM (measured: a llama-tiny block's pool 852,992 bytes against the
        # 754,688 it saves).
        self.stores[key] = (weakref.ref(t if local is not t or t._base is None else t._base), store)
        return _Swapped(store, local, spec)

    def _copy(self, raw: torch.Tensor, owner: torch.Tensor) -> _Stored:
        """A :class:`_Stored` holding a copy of the bytes ``raw`` (of ``owner``'s storage)."""
        host = torch.empty(raw.numel(), dtype=torch.uint8, pin_memory=self.cuda)
        return _Stored(self, host, self._to_host(host, raw, owner))

    def _copy_alone(self, local: torch.Tensor) -> tuple[_Stored, torch.Tensor]:
        """A saved tensor of a much larger storage: its own bytes only, laid out as it is
        (:func:`host_buffer`); returns the :class:`_Stored` and the host copy (its layout)."""
        buf = host_buffer(local, pin=self.cuda)
        return _Stored(self, storage_bytes(buf), self._to_host(buf, local, local)), buf

    def _to_host(self, dst: torch.Tensor, src: torch.Tensor, owner: torch.Tensor) -> Any:
        """Copy ``src`` into ``dst``: on CUDA on the side stream after the producing kernels, with
        ``owner``'s memory held for that stream; returns the copy's event (None on a CPU)."""
        if not self.cuda:
            dst.copy_(src)
            return None
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
        owner.record_stream(self.stream)
        return self.stream.record_event()

    def _device_copy(self, store: _Stored, prefetch: bool) -> torch.Tensor:
        """``store``'s bytes on the device: on the prefetch's stream (``landed`` set), or on the
        compute stream (the backward waits for it); on a CPU a separate copy the device accounting counts."""
        if store.done is None:
            return store.host.clone()
        if not prefetch:
            torch.cuda.current_stream(self.device).wait_event(store.done)
            return store.host.to(self.device, non_blocking=True)
        with torch.cuda.stream(self.in_stream):
            self.in_stream.wait_event(store.done)
            back = store.host.to(self.device, non_blocking=True)
            store.landed = self.in_stream.record_event()
        return back

    def prefetch(self, group: tuple[int, int], on_back: Callable[[torch.Tensor], None] | None = None) -> int:
        """Start copying back the last swapped block of ``group``'s forward (stage, micro-batch),
        the first its backward needs (module docstring); returns the bytes brought back.
        ``on_back`` sees each copy."""
        blocks = self.blocks.get(group)
        if not blocks:
            return 0
        self.chained.add(group)
        return self._fetch(group, len(blocks) - 1, on_back)

    def _fetch(self, group: tuple[int, int], k: int, on_back: Callable[[torch.Tensor], None] | None) -> int:
        """Copy back swapped block ``k`` of ``group`` on the prefetch's stream."""
        nbytes = 0
        fetched = self.fetched.setdefault(group, [])
        for ref in self.blocks[group][k]:
            store = ref()
            if store is None or store.back is not None:
                continue
            store.back = self._device_copy(store, prefetch=True)
            if on_back is not None:
                on_back(store.back)
            nbytes += store.host.numel()
            fetched.append(ref)
        return nbytes

    def prefetch_after(self, current: tuple[int, int], group: tuple[int, int],
                       on_back: Callable[[torch.Tensor], None] | None = None) -> None:
        """Prefetch ``group`` when the backward of ``current`` (prefetched, same stage) reaches its
        first swapped block, not now: one block fewer on the device at the cool-down's peak."""
        if current in self.chained and self.blocks.get(current):
            self.deferred[current] = (group, on_back)
        else:
            self.prefetch(group, on_back)

    def release(self, group: tuple[int, int]) -> None:
        """After ``group``'s backward action: drop the device copies it holds, and what its forward
        filed (a W after an I brings back what it needs as it asks); start a prefetch it deferred
        and never reached."""
        if (waiting := self.deferred.pop(group, None)) is not None:
            self.prefetch(*waiting)
        n = len(self.blocks.pop(group, []))
        self.started -= {(group, k) for k in range(n)}
        self.chained.discard(group)
        for ref in self.fetched.pop(group, []):
            store = ref()
            if store is not None:
                store.back, store.landed = None, None

    def unpack(self, s: _Swapped | torch.Tensor, on_back: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """The tensor back on the device: a view of its storage's prefetched copy, else of a copy
        made now (which the storage's other views share while autograd holds it). ``on_back`` sees
        each view made from a copy made now (the device accounting counts it until it is freed)."""
        if isinstance(s, torch.Tensor):
            return s
        store = s.store
        if store.block is not None and store.block[0] in self.chained and store.block not in self.started:
            # A prefetched backward's swapped block begins: the next swapped block below it starts coming back.
            self.started.add(store.block)
            group, k = store.block
            if k > 0:
                self._fetch(group, k - 1, on_back)
            elif (waiting := self.deferred.pop(group, None)) is not None:  # its first swapped block: the next's turn
                self.prefetch(*waiting)
        if store.back is not None:
            if store.landed is not None:  # the compute stream waits for the prefetch once and holds its memory
                compute = torch.cuda.current_stream(self.device)
                compute.wait_event(store.landed)
                store.back.record_stream(compute)
                store.landed = None
            back = _view(store.back, s)
        else:
            first = store.lazy() if store.lazy is not None else None
            back = _view(first if first is not None else self._device_copy(store, prefetch=False), s)
            if first is None:
                store.lazy = weakref.ref(back)
            if on_back is not None:
                on_back(back)
        if s.spec is None:
            return back
        from torch.distributed.tensor import DTensor

        mesh, placements, shape, stride = s.spec
        return DTensor.from_local(back, mesh, placements, run_check=False, shape=shape, stride=stride)


@contextlib.contextmanager
def swapping(pool: HostPool, on_unpack: Callable[[torch.Tensor], None] | None = None) -> Iterator[None]:
    """Send every tensor saved for backward inside the block to ``pool``.

    ``on_unpack`` sees each device copy made (the device accounting counts it as transient until
    it is freed).
    """

    def unpack(s: _Swapped | torch.Tensor) -> torch.Tensor:
        return pool.unpack(s, on_unpack)

    pool.begin_block()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pool.pack, unpack):
            yield
    finally:
        pool.stores.clear()


def install_prefetch(stages: Sequence[Any], pool: HostPool, order: Sequence[Action], swapped: set[int],
                     on_fetch: Callable[[torch.Tensor], None] | None = None, lazy: Collection[int] = ()) -> None:
    """Run vPipe's prefetch on this rank's pipeline stages (module docstring).

    Wraps each stage's ``forward_one_chunk`` (what it swaps is filed under its (stage, micro-batch),
    block by block), ``backward_one_chunk`` (B, or I with ``full_backward=False``: its copies are
    dropped when it ends) and ``backward_weight_one_chunk`` (W): as each action starts, the backward
    that :func:`~mindpipe.simulator.actions.prefetched_backward` names after it in ``order`` (the
    rank's actions, as the simulator times them) has its last swapped block copied back, if
    ``swapped`` holds that stage. An action ``order`` does not hold starts nothing. The filing also
    lets each backward bring its other swapped blocks back one ahead (:meth:`HostPool.unpack`).
    A stage in ``lazy`` (``Plan.swap_copy_back``) is not prefetched: its backwards copy back as they ask.
    """
    actions = list(order)
    index = {a: i for i, a in enumerate(actions)}
    pool.actions_only = True

    def ahead(a: Action) -> None:
        i = index.get(a)
        nxt = None if i is None else prefetched_backward(actions, i, lazy)
        if nxt is None or nxt.stage not in swapped:
            return
        if a.kind in ("B", "I") and a.stage == nxt.stage:  # 1F1B's cool-down: after this one's first swapped block
            pool.prefetch_after((a.stage, a.microbatch), (nxt.stage, nxt.microbatch), on_fetch)
        else:
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


__all__ = ["WHOLE_STORAGE_RATIO", "HostPool", "host_buffer", "install_prefetch", "is_weight", "local_tensor",
           "storage_bytes", "swapping"]
