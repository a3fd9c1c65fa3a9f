"""Live-tensor accounting of one rank's device memory, and the emulated device capacity.

What is counted — the same terms the simulator's memory model prices per pipeline rank
(:func:`mindpipe.simulator.memory.stage_memory`), so the two compare term by term:

* **weights**: the local storage of every parameter of the rank's stage modules (the local shard
  under TP or ZeRO), counted once after the model is built; and the whole weights FSDP2 gathers
  (``fully_shard`` and ``replicate`` alike) while they exist (:meth:`MemoryAccount.watch_gathered`: re-read around each
  wrapped module's forward and after each backward action) — kept until torch reduces the stage's
  gradients after its last backward (re-read there too) unless ZeRO-3 frees them after each forward
  (:func:`mindpipe.traces.layout.keeps_gathered_weights`);
* **gradients**: the local ``.grad`` of every parameter, re-read after each backward action (0
  after ``zero_grad(set_to_none=True)`` at the start of a step, as in torch);
* **optimizer**: every tensor in the optimizers' state (AdamW ``exp_avg``, ``exp_avg_sq``,
  ``step``), re-read after each optimizer step;
* **activations**: every tensor autograd saves for backward during the pipeline schedule's step
  (the stage forwards and the loss), through ``torch.autograd.graph.saved_tensors_hooks``,
  counted once per storage (Q, K and V, views of one QKV output, count once) from the moment it
  is saved until autograd releases it. Parameters saved by their layers are weights, not
  activations. A fully recomputed block saves only its input (the checkpoint's saved inputs); a
  swapped block saves nothing on the device (:mod:`mindpipe.executor.offload`);
  A ``nongemm`` block also keeps the GEMM outputs selective activation checkpointing caches for
  its recompute (:meth:`MemoryAccount.cached`), from its forward until its backward frees them;
* **transient**: tensors that exist only for a block's backward: what a recomputed forward saves
  for the backward (a ``TorchDispatchMode`` in the checkpoint's recompute context sees the
  checkpoint keep them), the copies a swapped block brings back, and the output gradients a
  split backward's I keeps for W (one per parameter group: torch's ``stage_backward_input``), each
  until it is freed; and
  every tensor the loss's backward makes, from the loss down to the logits' gradient (the fp32
  gradients of torch's cross-entropy, or a chunked loss's pieces: :meth:`MemoryAccount.counting_loss`),
  or down to the head's input under ``fused_head_loss`` (each piece's logits and softmax, the head's
  input and weight gradients; a weight gradient that stays as the parameter's ``.grad`` is a
  gradient from the next re-read on, and one accumulated in place is not counted twice).

Not counted: the forward torch's pipelining runs once, on the first step, to infer the shapes a
stage sends (:func:`mindpipe.executor.torch_pipelining.around_metadata_inference`; it is not
training and it is released by the first backward), the pipeline's send/receive buffers and stage outputs, the causal masks and rotary tables made per call,
temporaries of the forward and backward that autograd does not keep, communication buffers and
allocator slack. On CUDA the measured peak is the allocator's (``torch.cuda.max_memory_allocated``),
which includes them; the accounting is recorded beside it.

The peak of the sum is tracked at every change. With a capacity (``--memory-budget-gib``) a
change that takes the sum above it raises a :class:`~mindpipe.traces.errors.ContractError` naming
the rank, its stages and the terms; the rank stops before the step completes, so no checkpoint is
written for that step (earlier checkpoints stay as they are).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from mindpipe.executor.offload import is_weight
from mindpipe.executor.offload import local_tensor as _local
from mindpipe.executor.torch_pipelining import around_metadata_inference
from mindpipe.traces.errors import ContractError
from mindpipe.traces.result import GIB
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass(frozen=True, slots=True)
class MemoryTerms:
    """Accounted bytes of one rank at one instant (see module docstring)."""

    weights: int = 0
    gradients: int = 0
    optimizer: int = 0
    activations: int = 0
    transient: int = 0

    @property
    def total(self) -> int:
        """Sum of the terms."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.transient


def _storage(t: torch.Tensor) -> tuple[int, int] | None:
    """(key, bytes) of ``t``'s storage; None for tensors without one of their own (empty, meta)."""
    t = _local(t)
    try:
        st = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return (st.data_ptr(), st.nbytes()) if st.nbytes() else None


def fsdp_param_groups(state: Any) -> list[Any]:
    """The parameter groups of one FSDP2 state (``fully_shard``'s or ``replicate``'s): torch ≥ 2.12
    keeps a list ``_fsdp_param_groups``, earlier releases one ``_fsdp_param_group`` (or None)."""
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = getattr(state, "_fsdp_param_group", None)
    return [] if group is None else [group]


def all_fsdp_param_groups(module: FSDPModule) -> list[Any]:
    """Every FSDP2 parameter group under a ``fully_shard``/``replicate`` root ``module``: its own and
    those of the modules wrapped inside it (torch's private state, as torch 2.6–2.14 keep it).
    Walks the modules, so it holds before the first forward's lazy initialisation too."""
    root = cast(nn.Module, module)  # an FSDPModule is an nn.Module subclass made by fully_shard/replicate
    return [group for m in root.modules() if isinstance(m, FSDPModule)
            for group in fsdp_param_groups(m._get_fsdp_state())]


def all_fsdp_params(module: FSDPModule) -> list[Any]:
    """Every ``FSDPParam`` under a ``fully_shard``/``replicate`` root ``module`` (:func:`all_fsdp_param_groups`)."""
    return [fp for group in all_fsdp_param_groups(module) for fp in group.fsdp_params]


def _fsdp_params(module: FSDPModule) -> list[Any]:
    """The ``FSDPParam``s of a ``fully_shard``/``replicate`` module's own parameter groups (none
    where torch's private state is not where torch 2.6–2.14 keep it)."""
    return [fp for g in fsdp_param_groups(module._get_fsdp_state()) for fp in getattr(g, "fsdp_params", None) or []]


class _Held:
    """A saved activation counted in ``account``; autograd releasing it uncounts it."""

    __slots__ = ("account", "key", "tensor")

    def __init__(self, account: MemoryAccount, tensor: torch.Tensor, key: int) -> None:
        self.account, self.tensor, self.key = account, tensor, key

    def __del__(self) -> None:
        self.account._release("activations", self.key)


class _RecomputeOutputs(TorchDispatchMode):
    """Counts what a recomputed forward saves for the backward as transient, until it is freed.

    torch's checkpoint keeps each recomputed tensor that requires grad as ``x.detach()``: the
    outputs of ``aten.detach`` in the recompute are those tensors (saved tensors that need no
    grad, such as LayerNorm statistics, 1/h of the rest, are missed).
    """

    def __init__(self, account: MemoryAccount) -> None:
        super().__init__()
        self.account = account

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        # Data parallelism's hooks also detach the gathered weights in the recompute: not activations.
        if func is torch.ops.aten.detach.default and isinstance(out, torch.Tensor) and not is_weight(args[0]):
            self.account.transient(out)
        return out


class _AllOutputs(TorchDispatchMode):
    """Counts every tensor an operator makes as transient, until it is freed; an alias of a
    saved activation (autograd unpacking what the loss saved) is already counted."""

    def __init__(self, account: MemoryAccount) -> None:
        super().__init__()
        self.account = account

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and not self.account.is_activation(t):
                self.account.transient(t)
        return out


class _CountedLoss(torch.autograd.Function):
    """A loss whose backward runs under :class:`_AllOutputs` (:meth:`MemoryAccount.counting_loss`).

    The forward builds the loss's graph on a detached alias of the logits (same storage; what
    the loss saves passes the account's saved-tensor hooks as before) and the backward walks it
    with ``torch.autograd.grad`` inside the mode: autograd restores each node's thread-local
    state, so a mode must live inside one node to see the loss's whole backward.

    A loss that holds parameters (``with_weights``: the LM head fused into it, ``fused_head_loss``)
    is walked with ``torch.autograd.backward`` instead, so that their gradients accumulate as in
    any backward (the alias's gradient is the input's), after re-reading the weights FSDP2's
    pre-backward hook has just gathered for it (under ZeRO-3). The exception is torch's one-time
    metadata inference (the account is paused then), which asks for the stage inputs' gradients
    only, from a forward of uninitialised tensors: nothing may reach the parameters' gradients there.
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor,
                loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], account: MemoryAccount,
                with_weights: bool) -> torch.Tensor:
        x = logits.detach().requires_grad_(True)
        with torch.enable_grad():
            loss = loss_fn(x, targets)
        ctx.inner, ctx.account, ctx.with_weights = (x, loss), account, with_weights
        return loss.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        x, loss = ctx.inner
        del ctx.inner
        accumulate = ctx.with_weights and not ctx.account.paused_now
        if accumulate:
            ctx.account.refresh_gathered()
        with _AllOutputs(ctx.account):
            if accumulate:
                torch.autograd.backward(loss, grad)
                g, x.grad = x.grad, None
            else:
                (g,) = torch.autograd.grad(loss, x, grad)
        return g, None, None, None, None


class MemoryAccount:
    """The accounted device memory of one rank (module docstring).

    Args:
        modules: The rank's stage modules (their weights are counted by :meth:`count_weights`, once
            they are parallelised).
        device: The rank's device; only tensors on its device type are counted.
        where: How the budget error names the rank (e.g. ``pipeline rank 1 (stage 1)``).
        budget_bytes: The emulated device capacity, or None.
    """

    def __init__(self, modules: Sequence[nn.Module], device: torch.device, where: str,
                 budget_bytes: int | None = None) -> None:
        self.modules, self.device_type, self.where, self.budget = modules, device.type, where, budget_bytes
        self.step = 0
        self._counts: dict[str, dict[int, int]] = {"activations": {}, "transient": {}}
        self._bytes: dict[str, dict[int, int]] = {"activations": {}, "transient": {}}
        self.terms = self.peak = MemoryTerms()
        self._weights: set[int] = set()
        self._shard_bytes = 0
        self._groups: list[list[nn.Module]] = []  # per watched FSDP2 module, the modules whose parameters it gathers
        self._gathered: list[dict[int, int]] = []  # per group, its gathered storages' bytes
        self._fsdp_params: list[Any] = []  # the watched modules' FSDPParams (their accumulated gradients)
        self._cached: dict[int, int] = {}  # storages of outputs selective checkpointing caches (:meth:`cached`)
        self._grads: set[int] = set()  # the gradients' storages at the last refresh_gradients
        self._paused = 0
        self.exceeded: ContractError | None = None
        self.window = 0  # the peak since open_window(): one action's (ActionRecord.memory_bytes)

    # -- terms -------------------------------------------------------------------------------
    def _params(self) -> Iterator[nn.Parameter]:
        for m in self.modules:
            yield from m.parameters()

    def _param_bytes(self) -> int:
        return sum(s[1] for p in self._params() if (s := _storage(p)) is not None)

    def _set(self, **terms: int) -> None:
        t = self.terms
        self.terms = MemoryTerms(**{k: terms.get(k, getattr(t, k)) for k in MemoryTerms.__dataclass_fields__})
        total = self.terms.total
        if total > self.peak.total:
            self.peak = self.terms
        if total > self.window:
            self.window = total
        if self.budget is not None and total > self.budget:
            self._over(total)

    def open_window(self) -> None:
        """Start a new :attr:`window` at the current total (an action begins)."""
        self.window = self.terms.total

    def _over(self, total: int) -> None:
        if self.exceeded is not None:
            return
        t = self.terms
        self.exceeded = ContractError("--memory-budget-gib", None, (
            f"{self.where} needs {total / GIB:.4f} GiB at step {self.step} (weights {t.weights / GIB:.4f}, gradients "
            f"{t.gradients / GIB:.4f}, optimizer {t.optimizer / GIB:.4f}, activations {t.activations / GIB:.4f}, "
            f"transient {t.transient / GIB:.4f}), over the budget of {self.budget / GIB:.4f} GiB"))  # type: ignore[operator]
        raise self.exceeded

    def count_weights(self) -> None:
        """Count the parameters' local storage (once the modules are parallelised).

        Buffers a layer saves for backward (Llama's rotary cos/sin tables) are persistent module
        state, not a micro-batch's activations: they are left out of the activations like weights.
        """
        self._weights = {s[0] for p in self._params() if (s := _storage(p)) is not None}
        self._weights |= {s[0] for m in self.modules for b in m.buffers() if (s := _storage(b)) is not None}
        self._shard_bytes = self._param_bytes()
        self._set(weights=self._shard_bytes)

    def watch_gathered(self) -> None:
        """Count the whole weights FSDP2 gathers, beside their local shards, while they exist.

        While gathered, a wrapped module's parameters are the full tensors (FSDP2 swaps them in
        for the compute); their storages are not the shards :meth:`count_weights` recorded. Each
        wrapped module's own parameters (those of no wrapped module inside it) are re-read before
        and after its forward (FSDP2's own hooks, registered first, gather and free them); all are
        re-read after each backward action (:meth:`refresh_gradients`).
        Called wherever the data-parallel wrapper is applied: under ``replicate`` (ZeRO-0) the
        parameters FSDP2 swaps in for the compute are copies too, not the replica's storage
        (:func:`mindpipe.traces.layout.keeps_gathered_weights`).
        """
        for mod in self.modules:
            for m in mod.modules():
                if isinstance(m, FSDPModule):  # after FSDP2's own hooks: gathered before, maybe freed after
                    owned: list[nn.Module] = []
                    todo: list[nn.Module] = [m]
                    while todo:
                        x = todo.pop()
                        owned.append(x)
                        todo += [c for c in x.children() if not isinstance(c, FSDPModule)]
                    self._groups.append(owned)
                    self._fsdp_params += _fsdp_params(m)
                    self._gathered.append({})
                    k = len(self._groups) - 1
                    m.register_forward_pre_hook(lambda *_, k=k: self._refresh_gathered(k))
                    m.register_forward_hook(lambda *_, k=k: self._refresh_gathered(k))

    def refresh_gathered(self) -> None:
        """Re-read every watched module's gathered storages (nothing when none is watched)."""
        if self._groups:
            self._refresh_gathered(*range(len(self._groups)))

    def _refresh_gathered(self, *groups: int) -> None:
        """Re-read the gathered storages of ``groups`` (indices into the watched modules' groups)."""
        for k in groups:
            self._gathered[k] = {s[0]: s[1] for x in self._groups[k] for p in x.parameters(recurse=False)
                                 if (s := _storage(p)) is not None and s[0] not in self._weights}
        seen: dict[int, int] = {}
        for g in self._gathered:  # a storage shared by two groups counts once
            seen.update(g)
        self._set(weights=self._shard_bytes + sum(seen.values()))

    def refresh_gradients(self) -> None:
        """Re-read the gradients' bytes (after a backward action, and after ``zero_grad``), and the
        gathered weights where they are watched (:meth:`watch_gathered`).

        Besides each parameter's ``.grad``: under mixed precision, a backward that does not reduce
        (every micro-batch but the step's last) leaves FSDP2's whole gradient in a buffer of the
        reduce dtype (fp32) on the parameter's ``FSDPParam`` (``unsharded_accumulated_grad``), not
        on any parameter; those buffers are gradients too.
        """
        self.refresh_gathered()
        grads = {s[0]: s[1] for p in self._params() if p.grad is not None and (s := _storage(p.grad))}
        for fp in self._fsdp_params:
            acc = getattr(fp, "unsharded_accumulated_grad", None)
            if isinstance(acc, torch.Tensor) and (s := _storage(acc)) is not None:
                grads[s[0]] = s[1]
        # A gradient the loss's backward made (the fused head's weight gradient on a stage's first
        # backward, kept as the parameter's .grad) is a gradient from here on, no longer transient.
        for key in grads.keys() & self._counts["transient"].keys():
            self._adopt(key)
        self._grads = set(grads)
        self._set(gradients=sum(grads.values()))

    def refresh_optimizer(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Re-read the optimizers' state bytes (after their step)."""
        total = 0
        for opt in optimizers:
            for state in opt.state.values():
                total += sum(s[1] for v in state.values() if isinstance(v, torch.Tensor) and (s := _storage(v)))
        self._set(optimizer=total)

    # -- activations and transients ------------------------------------------------------------
    def _hold(self, term: str, key: int, nbytes: int) -> None:
        counts = self._counts[term]
        counts[key] = counts.get(key, 0) + 1
        if counts[key] == 1:
            self._bytes[term][key] = nbytes
            self._set(**{term: getattr(self.terms, term) + nbytes})

    def _adopt(self, key: int) -> None:
        """Stop counting transient storage ``key`` (it became a gradient); its finalizer then finds nothing."""
        self._counts["transient"][key] = 1
        self._release("transient", key)

    def _release(self, term: str, key: int) -> None:
        counts = self._counts[term]
        if key not in counts:  # adopted as a gradient (_adopt) before its tensor was freed
            return
        counts[key] -= 1
        if counts[key] == 0:
            del counts[key]
            nbytes = self._bytes[term].pop(key)
            t = self.terms
            self.terms = MemoryTerms(**{**{k: getattr(t, k) for k in MemoryTerms.__dataclass_fields__},
                                        term: getattr(t, term) - nbytes})

    def _pack(self, t: torch.Tensor) -> Any:
        local = _local(t)
        if self._paused or is_weight(t) or local.device.type != self.device_type:
            return t
        s = _storage(local)
        if s is None or s[0] in self._weights:
            return t
        self._hold("activations", *s)
        # Hold a detached alias: a saved *output* held with its grad_fn would close a cycle through
        # autograd's C++ graph (node → saved variable → this object → tensor → node) that Python's
        # collector cannot see. Zero-bubble schedules never re-run the loss's nodes after their
        # input-gradient pass (retain_graph=True), so the cycle kept every micro-batch's log-probs
        # alive: ~12 MiB per micro-batch per step on gpt-tiny-8k's last stage. Autograd re-attaches
        # the grad_fn when it unpacks.
        return _Held(self, t.detach(), s[0])

    @staticmethod
    def _unpack(p: Any) -> torch.Tensor:
        return p.tensor if isinstance(p, _Held) else p

    @contextlib.contextmanager
    def saving(self, step: int) -> Iterator[None]:
        """Count the tensors saved for backward while the schedule's step ``step`` runs."""
        self.step = step
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield
        except Exception:
            if self.exceeded is not None:  # torch's pipelining wraps it in a RuntimeError
                raise self.exceeded from None
            raise

    def transient(self, t: torch.Tensor) -> None:
        """Count ``t`` as transient until it is freed (a recomputed output, a swapped-in copy).

        An output selective checkpointing cached (:meth:`cached`) and hands back to the recompute is
        already an activation and is not counted twice.
        """
        local = _local(t)
        s = _storage(local) if local.device.type == self.device_type else None
        # A gradient accumulated in place (a fused head's weight gradient, a later micro-batch) is
        # the gradient's storage, counted as a gradient already; a gathered weight a loss unpacks
        # (a fused head's) is counted as weights.
        # An alias of a held activation (a recompute re-saving the checkpoint's input, or the q, k
        # and v views it was given) is no new memory: counted once, as the activation.
        if s is None or s[0] in self._weights or s[0] in self._cached or s[0] in self._grads \
                or s[0] in self._counts["activations"] or any(s[0] in g for g in self._gathered):
            return
        self._hold("transient", *s)
        weakref.finalize(local, self._release, "transient", s[0]).atexit = False  # nothing to do at exit

    def is_activation(self, t: torch.Tensor) -> bool:
        """True when ``t``'s storage is held as an activation now."""
        s = _storage(t)
        return s is not None and s[0] in self._counts["activations"]

    def counting_loss(self, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                      with_weights: bool = False) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """``loss_fn`` with its backward's temporaries counted as transient.

        Every tensor an operator makes in the loss's backward, down to the logits' gradient, is
        transient until freed (torch's cross-entropy: the NLL's and the log-softmax's fp32
        gradients; a chunked loss: its gradient and each piece's fp32 work): the simulator prices
        the same (:func:`mindpipe.simulator.memory.loss_transient_bytes`). ``with_weights``: the
        loss holds parameters whose gradients it must accumulate (a fused head, :class:`_CountedLoss`).
        """
        def counted(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = _CountedLoss.apply(logits, targets, loss_fn, self, with_weights)
            return out

        return counted

    def cached(self, t: torch.Tensor, owner: object) -> None:
        """Count ``t`` as an activation until ``owner`` is freed: an output torch's selective
        activation checkpointing caches in the forward for the recompute (it is not saved through
        autograd's hooks); ``owner`` is that checkpoint's recompute context, freed with its frame."""
        local = _local(t)
        if self._paused or local.device.type != self.device_type:
            return
        s = _storage(local)
        if s is None or s[0] in self._weights:
            return
        self._hold("activations", *s)
        self._cached[s[0]] = self._cached.get(s[0], 0) + 1
        weakref.finalize(owner, self._uncache, s[0]).atexit = False

    def _uncache(self, key: int) -> None:
        self._cached[key] -= 1
        if not self._cached[key]:
            del self._cached[key]
        self._release("activations", key)

    def watch_kept_gradients(self, stage: Any) -> None:
        """Count, as transient until W frees them, the output gradients a split backward's I keeps
        for W: per parameter group, the gradient of the output its weights act on (torch's
        ``stage_backward_input``; the stage's ``backward_state``). Installed below the action
        recorder (:meth:`mindpipe.executor.measure.Recorder.wrap_stage`), so that they count in I's
        window as they exist by its end."""
        bwd = stage.backward_one_chunk

        def backward_one_chunk(*args: Any, **kwargs: Any) -> Any:
            out = bwd(*args, **kwargs)
            chunk = args[0] if args else kwargs.get("bwd_chunk_id")
            state = getattr(stage, "backward_state", {}).get(chunk)
            for group in (state[1] or []) if state is not None else []:
                for grads in group.get("grads") or []:
                    for t in grads or ():
                        if isinstance(t, torch.Tensor):
                            self.transient(t)
            return out

        stage.backward_one_chunk = backward_one_chunk

    def wrap_stage(self, stage: Any) -> None:
        """Re-read the gradients after each of the pipeline stage's backward actions (B, I, W), and re-read the gradients
        after torch's gradient reduction that follows the stage's last one (``perform_reduce_grad``:
        FSDP2 reduce-scatters the gradients there and frees the weights it gathered, while the
        rank's other stages may still run their backwards)."""
        bwd, bww, reduce = stage.backward_one_chunk, stage.backward_weight_one_chunk, stage.perform_reduce_grad

        def backward_one_chunk(*args: Any, **kwargs: Any) -> Any:
            out = bwd(*args, **kwargs)
            self.refresh_gradients()
            return out

        def backward_weight_one_chunk(*args: Any, **kwargs: Any) -> Any:
            out = bww(*args, **kwargs)
            self.refresh_gradients()
            return out

        def perform_reduce_grad(*args: Any, **kwargs: Any) -> Any:
            out = reduce(*args, **kwargs)
            self.refresh_gradients()
            return out

        stage.backward_one_chunk = backward_one_chunk
        stage.backward_weight_one_chunk = backward_weight_one_chunk
        stage.perform_reduce_grad = perform_reduce_grad
        around_metadata_inference(stage, self.paused)

    @property
    def paused_now(self) -> bool:
        """True inside :meth:`paused` (torch's metadata inference)."""
        return self._paused > 0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Count nothing saved meanwhile (torch's one-time metadata inference of the first step)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def recompute_contexts(self) -> tuple[contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]]:
        """``context_fn`` for ``torch.utils.checkpoint``: nothing in the forward, counting in the recompute."""
        return contextlib.nullcontext(), _RecomputeOutputs(self)


__all__ = ["MemoryAccount", "MemoryTerms", "fsdp_param_groups"]
