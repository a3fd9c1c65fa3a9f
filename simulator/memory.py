"""Per-rank device memory of a plan: model states, held activations, transients.

What one transformer block keeps per micro-batch (Korthikanti et al.'s accounting, per precision,
for GPT and Llama blocks, with FlashAttention, sequence and context parallelism) is
:mod:`mindpipe.simulator.activations`'s; the last stage's head and loss are
:mod:`mindpipe.simulator.head_memory`'s. This module adds the model states, the schedule's held
micro-batches, each backward's transient and the framework's reserve, per pipeline rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass

from mindpipe.simulator.actions import Action, Held, Schedule, prefetched_backward
from mindpipe.simulator.activations import (
    FLASH_STAT_BYTES,
    GEMM_INPUT_BYTES,
    GPU_MASK_BYTES,
    activation_bytes_per_layer,
    embedding_activation_bytes,
    final_norm_grad_bytes,
    weight_pass_grad_bytes,
)
from mindpipe.simulator.block_parts import part_params
from mindpipe.simulator.build import GRAD_BYTES
from mindpipe.simulator.costs import DTYPE_BYTES, layer_params
from mindpipe.simulator.head_memory import (
    head_activation_bytes,
    head_input_bytes,
    head_logit_bytes,
    logit_count,
    loss_transient_bytes,
)
from mindpipe.simulator.schedules import build_schedule
from mindpipe.simulator.split_memory import SplitBackwardWalks
from mindpipe.simulator.work import swapped_below
from mindpipe.traces.catalog import DeviceSpec
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.config import stage_layers as plan_stage_layers
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import (
    BlockPart,
    BlockPolicy,
    accumulates_whole_gradients,
    block_policies,
    keeps_gathered_weights,
    lazy_copy_back,
    merged_weight_pass,
    reshards_after_forward,
    shards_reduced_gradients,
    stage_layout,
)
from mindpipe.traces.result import GIB, StageMemoryParts
from mindpipe.traces.units import plural

# Adam optimizer states per parameter (Megatron ``theoretical_memory_usage``; ZeRO, Rajbhandari et
# al. 2020 §3.1): mixed precision keeps an fp32 master copy and fp32 m, v (12 B); fp32 training
# updates the weights in place (m, v: 8 B). Gradients use the build's dtype (fp32 main_grad under
# bf16, as Megatron forces; fp16 grads under fp16), so bf16 totals Megatron's 18 B/param and fp16
# the ZeRO paper's 16 B/param; fp32 is 4 + 4 + 8.
OPTIMIZER_BYTES = {"fp32": 8, "bf16": 12, "fp16": 12, "fp8": 12}
# FP8 training (plan precision ``fp8``) is bf16 mixed precision plus FP8 copies (Transformer Engine
# 1.x, ``transformer_engine/pytorch/module/linear.py``): the weights stay bf16 with fp32 master
# copies (OPTIMIZER_BYTES, GRAD_BYTES as bf16), and each Linear caches its weight cast to FP8 and
# that cast's transpose for the backward across the micro-batches of an iteration ("fp8 weight
# caching", ``is_first_microbatch``): 2 more bytes per parameter. Counted on every parameter, an upper
# bound: the embedding, the LM head and the norms stay bf16 (Megatron's output layer is not a TE
# module). The saved inputs of the blocks' GEMMs are their FP8 casts (TE saves ``inputmat`` as
# Float8Tensor for the weight gradient): 1 byte per element, GEMM_INPUT_BYTES.
FP8_WEIGHT_CACHE_BYTES = {"fp8": 2}
# Framework overhead on a GPU: CUDA context with torch's kernels (~0.5 GiB) plus NCCL
# communicator buffers and allocator slack; a rough, documented figure. CPUs: 0. Of it, what the
# caching allocator itself holds is the cuBLAS workspaces (:func:`allocator_overhead_bytes`).
# Read on an H200 (torch 2.11, CUDA 13, one rank; benchmarks/gpu_check.sh `open`): context 621 MiB,
# NCCL's communicator +578 MiB, cuBLAS's first GEMM +44 MiB outside the allocator: 1.21 GiB, with
# the allocator's two workspaces 1.28 GiB. Left at 1 GiB: one reading, of one software stack.
GPU_RESERVED_BYTES = 1 * GIB
# torch's default cuBLAS workspace per handle and stream (CUBLAS_WORKSPACE_CONFIG ":4096:2:16:8",
# 2 × 4 MiB + 8 × 16 KiB) where devices.json gives none (Hopper: 32 MiB).
DEFAULT_CUBLAS_WORKSPACE_BYTES = 2 * 4 * 2**20 + 8 * 16 * 2**10
# A training step uses cuBLAS from two host threads, each with its own handle and workspace: the
# one running the forward and autograd's device thread running the backward.
CUBLAS_THREADS = 2


def allocator_overhead_bytes(device: DeviceSpec) -> float:
    """The part of :data:`GPU_RESERVED_BYTES` the caching allocator holds (so its peak counts it):
    the cuBLAS workspaces of the forward's and the backward's threads. Measured on an H100 (torch
    2.11, ``benchmarks/gpu_check_report.py``): the allocator's peak exceeds the live tensors by
    69 MiB plus a batch-dependent part, against 2 × 32 MiB here. 0 on a CPU."""
    if device.kind == "cpu":
        return 0.0
    from mindpipe.simulator.perf.constants import device_facts  # the GPU facts file, only for GPUs

    per = (device_facts().get(device.name) or {}).get("cublas_workspace_bytes", DEFAULT_CUBLAS_WORKSPACE_BYTES)
    return float(CUBLAS_THREADS * int(per))


def model_state_bytes(params: float, plan: Plan) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes for ``params`` parameters on one rank.

    ZeRO (Rajbhandari et al. 2020): stage 1 shards optimizer states over dp (= Megatron's
    distributed optimizer, 6 + 12/dp B/param under bf16), stage 2 also gradients, stage 3 also
    weights (gradients only with one micro-batch per step:
    :func:`mindpipe.traces.layout.accumulates_whole_gradients`). Where FSDP2 keeps the weights it gathers for the whole step
    (:func:`mindpipe.traces.layout.keeps_gathered_weights`: ZeRO-0/1/2 over dp > 1, and ZeRO-3
    under pipelining) the rank holds them whole beside their local storage; under mixed precision
    that storage is the fp32 master copy (in ``OPTIMIZER_BYTES``), under fp32 it is a copy of its
    own (1/dp more under ZeRO ≥ 1; a whole second copy for ZeRO-0's replica). Megatron-LM's data
    parallelism (``dp_impl`` ``megatron``) gathers ZeRO-0/1/2's weights into their own buffer: no
    second copy.
    """
    # The ranks that shard a distributed optimizer: dp·cp (context-parallel ranks hold the same weights).
    p, dp, z = plan.precision, plan.grad_replicas, plan.zero_stage
    whole = keeps_gathered_weights(plan)
    if reshards_after_forward(plan):
        # At rest only the shards: fp32's own; under mixed precision the fp32 master shard (in
        # OPTIMIZER_BYTES) is the parameter and the bf16 copy exists only gathered (StageMemoryModel.rank).
        weights = params * ((DTYPE_BYTES[p] if p == "fp32" else 0) + FP8_WEIGHT_CACHE_BYTES.get(p, 0)) / dp
    else:
        weights = params * (DTYPE_BYTES[p] + FP8_WEIGHT_CACHE_BYTES.get(p, 0))
    if whole and p == "fp32":
        weights += params * DTYPE_BYTES[p] / (dp if z >= 1 else 1)
    grads = params * GRAD_BYTES[p] / (dp if z >= 2 and not accumulates_whole_gradients(plan) else 1)
    optim = params * OPTIMIZER_BYTES[p] / (dp if z >= 1 else 1)
    return weights, grads, optim


@dataclass(frozen=True)
class RankMemory(StageMemoryParts):
    """Peak device memory of one pipeline rank, in bytes.

    Attributes:
        weights_bytes, gradients_bytes, optimizer_bytes: Model states after ZeRO sharding.
        activations_bytes: Peak over the schedule of the activations held for backward (blocks,
            embedding and head extras), weighted per stage.
        other_bytes: Transients and overhead: one block's full activations while it is
            recomputed or swapped back (less what the backward freed before it,
            ``StageMemoryModel.redone_bytes``), ZeRO-3's gathered weights, and the reserved bytes.
        total_bytes: Sum of the above.
        rank: Pipeline rank.
        capacity_bytes: The device's memory.
        fits: ``total_bytes <= capacity_bytes``, and ``host_bytes <= host_capacity_bytes`` where the
            device's host memory is known.
        host_bytes: Peak over the schedule of the swapped activations held in host memory
            (``layer_memory_policy`` swap; the executor's ``host_pool_peak_bytes``): not device memory.
        host_capacity_bytes: The host memory per device (``DeviceSpec.host_memory_bytes``); None: not known.
    """

    rank: int
    capacity_bytes: float
    fits: bool
    host_bytes: float = 0.0
    host_capacity_bytes: float | None = None

    @property
    def fits_device(self) -> bool:
        """``total_bytes <= capacity_bytes``."""
        return self.total_bytes <= self.capacity_bytes

    @property
    def fits_host(self) -> bool:
        """``host_bytes <= host_capacity_bytes``, or the host memory is not known."""
        return self.host_capacity_bytes is None or self.host_bytes <= self.host_capacity_bytes

    def gib(self) -> dict[str, float]:
        """Every device ``*_bytes`` field in GiB, keyed ``*_gib`` (the host's are not device memory)."""
        return {k.removesuffix("_bytes") + "_gib": v / GIB for k, v in asdict(self).items()
                if k.endswith("_bytes") and not k.startswith("host_")}


def _check(model: Model, plan: Plan, schedule: Schedule, stage_layers: list[int]) -> None:
    def fail(key: str, rule: str) -> None:
        raise ContractError("plan", key, rule)

    if schedule.pp != plan.pp:
        fail("pp", f"schedule has pp={schedule.pp}, plan has pp={plan.pp}")
    if len(stage_layers) != schedule.num_stages:
        fail("partition", f"{len(stage_layers)} stage layer counts for {schedule.num_stages} stages")
    if any(n < 0 for n in stage_layers) or sum(stage_layers) != model.num_layers:
        fail("partition", f"stage layers {stage_layers} do not split num_layers={model.num_layers}")
    if plan.layer_memory_policy is not None and len(plan.layer_memory_policy) != model.num_layers:
        fail("layer_memory_policy", f"{plural(len(plan.layer_memory_policy), 'entry', 'entries')} for num_layers={model.num_layers}")


# a backward's (stage, kind, sets, across, first: the stage's first backward of the step), else a forward
# (False) or the end (True)
_Next = tuple[int, str, int, int, bool] | bool
_Point = tuple[float, float, _Next, float]  # activations, gradients, what runs next, gathered weights freed


@dataclass(frozen=True)
class _StageTerms:
    """What one virtual stage adds to its rank's memory (see :func:`stage_memory`)."""

    per_microbatch_bytes: float  # activations held per micro-batch from its F until its B or I
    params: float  # parameters on one device
    largest_layer_params: float  # ZeRO-3 gathers the layer being computed whole
    # Per backward kind (B, I, W) and prefetched sets (Held.next_sets): (transient, redone). The
    # transient is what the backward adds on top of what is held when it starts — a recomputed or
    # swapped-back block's activations, or the loss's backward temporaries, whichever is larger —
    # and redone the recomputed or swapped-back block's part of it (StageMemoryModel.stage).
    transients: Mapping[tuple[str, int], tuple[float, float]]
    # Under a split backward, held per micro-batch from its I until its W (StageMemoryModel.stage).
    after_input_bytes: float = 0.0
    # On the host, per micro-batch from its F until its backward ends (W under a split backward):
    # what its swapped blocks copied out (StageMemoryModel.swapped_bytes).
    host_bytes: float = 0.0
    # What a prefetch of this stage's next backward brings back while another stage's backward
    # runs on the rank (Held.next_across): its last swapped block.
    last_swapped_bytes: float = 0.0
    # What the loss keeps of a micro-batch (head_logit_bytes): saved by the loss's forward, which
    # torch's pipelining runs after the last stage's F (StageMemoryModel.by_action).
    loss_kept_bytes: float = 0.0
    # A head fused into the loss (fused_head_loss): the final norm's and the head's weight gradients,
    # which the loss's backward makes at the start of the stage's first B (or I), before the blocks'
    # backward (their re-runs included) frees anything: llama-tiny pp4 GPipe with full recompute, the
    # first B 0.13 MiB above the model without them. Counted from then on (under a split backward
    # from the first I, before the first W makes the rest: gpt-mini cp2 ZB-H1, 2.0 MiB at F1, I1, W0).
    head_grad_bytes: float = 0.0

    def transient(self, kind: str, sets: int) -> tuple[float, float]:
        """(transient, redone) of a backward of ``kind`` with ``sets`` prefetched micro-batches
        (capped at the most the stage was priced for: a stage priced lazy has none)."""
        most = max(k[1] for k in self.transients if k[0] == kind)
        return self.transients[kind, min(sets, most)]


class StageMemoryModel(SplitBackwardWalks):
    """The per-stage and per-rank arithmetic of :func:`stage_memory` and
    :func:`mindpipe.simulator.planning.block_caps`.

    ``split_backward``: the schedule splits the backward into I and W (zero-bubble family), which
    changes what a stage holds between them and what a redone block adds (:meth:`stage`).
    """

    def __init__(self, model: Model, plan: Plan, device: DeviceSpec, reserved_bytes: float | None,
                 seq_len: int | None, *, split_backward: bool = False) -> None:
        self.model, self.plan, self.device, self.seq_len = model, plan, device, seq_len
        self.split_backward = split_backward
        cpu = device.kind == "cpu"
        self.mask = DTYPE_BYTES[plan.precision] if cpu else GPU_MASK_BYTES
        self.reserve = (0.0 if cpu else GPU_RESERVED_BYTES) if reserved_bytes is None else reserved_bytes
        self.params = {kind: n for _, kind, n in layer_params(model, plan.tp, plan)}
        parts = part_params(model, plan.tp)
        self.part_params: dict[BlockPart, int] = {"whole": self.params["block"], "attention": parts["attention"],
                                                  "mlp": parts["mlp"]}
        self._block: dict[tuple[BlockPolicy, BlockPart], float] = {}

    def block(self, policy: BlockPolicy, part: BlockPart = "whole") -> float:
        """Bytes one block (or part of one) keeps per micro-batch under ``policy``."""
        if (policy, part) not in self._block:
            self._block[policy, part] = activation_bytes_per_layer(
                self.model, self.plan, policy=policy, seq_len=self.seq_len, mask_bytes=self.mask, part=part)
        return self._block[policy, part]

    def stage(self, policies: list[BlockPolicy], has_embedding: bool, has_head: bool,
              parts: list[BlockPart] | None = None, *, prefetch: int = 0) -> _StageTerms:
        """Terms of a stage holding blocks with ``policies`` (and the embedding and/or head);
        ``parts`` says what it holds of each block (all ``whole`` by default). ``prefetch``: how many
        micro-batches' swapped blocks a prefetch has back at once (0: none is prefetched;
        :meth:`~mindpipe.simulator.actions.Schedule.prefetched_sets`; :meth:`redone_bytes`).

        Under a split backward (what the executor runs, measured with its live-tensor accounting)
        torch's I keeps the stage's graph for W (``retain_graph``): from I to W a micro-batch still
        holds everything it saved, less the loss's log-softmax (:func:`head_logit_bytes`). Nothing
        is freed while I runs. A recomputed block is re-run in I (its re-run tensors are freed with
        I), and again in W. Where the executor runs W as one autograd pass
        (:func:`mindpipe.traces.layout.merged_weight_pass`) the pass goes through the blocks last to
        first and has released one block's re-run before it re-runs the next: the transient is the
        largest recomputed block's :meth:`rerun_bytes` (gpt-mini-8, micro-batch 2: 5.02 MiB measured
        for one and for two recomputed blocks on a stage, 5 MiB counted — both with the input, which
        the accounting then counted again). Otherwise torch's pass per
        parameter group re-runs the block once per group (:func:`mindpipe.traces.layout.weight_groups`),
        each kept until W ends less what its pass consumed; counted whole, an upper bound (gpt-mini,
        micro-batch 2: 23.75 MiB measured for one block, 30 MiB counted, both with the input again). Plus a swapped block's
        largest tensor while it is unpacked. The first stage is the exception: its input is token
        ids, torch's I there does nothing and its W runs an ordinary backward, so it keeps
        everything until W and frees block by block as in B. The last stage's transient is at
        least the loss's backward temporaries (:func:`loss_transient_bytes`).

        Each backward has its own transient (``_StageTerms.transients``, per kind and prefetched
        sets up to ``prefetch``; :meth:`rank` picks the one of the backward that comes next), not
        one figure per stage: a split backward's I brings back its prefetched blocks and runs the
        loss's backward, its W re-runs the recomputed blocks and asks for its swapped tensors
        as it goes (the executor dropped I's copies), and a cool-down's second prefetched block is
        there only in the cool-down.
        """
        model, plan, params = self.model, self.plan, self.params
        parts = parts or ["whole"] * len(policies)
        acts = sum(self.block(p, part) for p, part in zip(policies, parts, strict=True))
        layers = [self.part_params[part] for part in parts]
        head = head_activation_bytes(model, plan, seq_len=self.seq_len) if has_head else 0.0
        loss = loss_transient_bytes(model, plan, seq_len=self.seq_len) if has_head else 0.0
        if has_head and plan.fused_head_loss and reshards_after_forward(plan):
            # The fused loss runs inside the stage's forward and backward: FSDP2 has the stage's own
            # layers (the final norm, the head and any embedding) gathered whole beside its temporaries.
            own = params["final_norm"] + params["lm_head"] + (params["embedding"] if has_embedding else 0)
            loss += DTYPE_BYTES[plan.precision] * own
        if has_embedding:
            acts += embedding_activation_bytes(model, plan, seq_len=self.seq_len, mask_bytes=self.mask)
            layers.append(params["embedding"])
        if has_head:
            acts += head
            layers += [params["final_norm"], params["lm_head"]]
        swap = "swap" in policies
        last = self.last_swapped_bytes(policies, parts) if swap else 0.0
        logits = head_logit_bytes(model, plan, seq_len=self.seq_len) if has_head else 0.0
        head_grads = (model_state_bytes(params["final_norm"] + params["lm_head"], plan)[1]
                      if has_head and plan.fused_head_loss else 0.0)
        transients: dict[tuple[str, int], tuple[float, float]] = {}
        for sets in range(prefetch + 1):
            # A full backward (B, and the first stage's W, which runs an ordinary backward: torch's I
            # there does nothing): the walk of redone_bytes; the loss's backward runs with the
            # prefetched last swapped block back.
            redone = self.redone_bytes(policies, parts, head, prefetch=sets)
            transients["B", sets] = (max(redone, loss + (last if sets and swap else 0.0)), redone)
        if not self.split_backward:
            return _StageTerms(acts, sum(layers), max(layers, default=0), transients, acts,
                               self.swapped_bytes(policies, parts), last, logits, head_grads)
        until_w = 0.0
        if has_head:
            # I keeps the logits' gradient for W's dW of the LM head (torch stores the gradients
            # of the stage's intermediate outputs that W needs): d·s·b·V/t until W. A head fused
            # into the loss takes its dW in I instead and releases its input there.
            until_w = (-head_input_bytes(model, plan, seq_len=self.seq_len) if plan.fused_head_loss
                       else DTYPE_BYTES[plan.precision] * logit_count(model, plan, seq_len=self.seq_len))
        if has_embedding:
            # The first stage: its I does nothing but hold its prefetched block (the executor drops
            # it when I ends); its W is an ordinary backward that asks for its swapped blocks as it
            # goes, beside the next I's prefetched block when that runs under it (gpt-mini ZB-H1,
            # two swapped blocks on stage 0: 5.0 MiB in I, 1.0 MiB in W, 6.0 MiB in a W before an I).
            lazy_b = transients["B", 0]
            for sets in range(prefetch + 1):
                transients["I", sets] = (sets * last, sets * last)
                transients["W", sets] = (lazy_b[0] + sets * last, lazy_b[1] + sets * last)
            return _StageTerms(acts, sum(layers), max(layers, default=0), transients, acts,
                               self.swapped_bytes(policies, parts), last, logits, head_grads)
        # I keeps each parameter group's output gradient for W (weight_pass_grad_bytes; gpt-mini
        # ZB-H1 pp2, last stage: 5.75 MiB per micro-batch awaiting W, -11 % before it was counted).
        head_kept = final_norm_grad_bytes(model, plan, seq_len=self.seq_len) if has_head else 0.0
        kept_grads = head_kept + sum(weight_pass_grad_bytes(model, plan, seq_len=self.seq_len, part=part) for part in parts)
        until_w += kept_grads
        full = [part for p, part in zip(policies, parts, strict=True) if p == "full"]
        rerun = {part: self.rerun_bytes(part) for part in full}
        if merged_weight_pass(model, policies, parts):
            # One merged pass walks the stage's graph again from its top: each block's nodes free
            # what they saved as the pass leaves them, so a recomputed block re-runs beside what
            # the blocks above it no longer hold (gpt-mini-8 ZB-H1 pp4, a recomputed block below a
            # kept one: W's peak is its start, measured; +13.6 % on W when its re-run was added
            # whole). The kept gradients stay to its end; a swapped tensor comes back as asked.
            # The pass starts at the head: the final norm's input and, unless the head is fused into
            # the loss (its input released in I), the head's input are freed first.
            above = (1 if plan.fused_head_loss else 2) * head_input_bytes(model, plan, seq_len=self.seq_len) if has_head else 0.0
            walk_w = self.merged_pass_reruns(policies, parts, rerun, above) + (self.largest_saved_bytes() if swap else 0.0)
        else:
            walk_w = self.weight_pass_walk(policies, parts, rerun)
        # I re-runs each recomputed block once, one at a time (the per-group passes are W's):
        # gpt-mini DualPipeV, a recomputed MLP part: 3.75 MiB measured, 11.25 counted before. A
        # selective block re-runs its attention core there too, and I frees nothing while it runs
        # (gpt-mini DualPipeV without FlashAttention, the cool-down's I: 2.6 MiB, -6.8 % before).
        # W needs no core: the GEMMs' inputs are kept.
        core = [self.block("none", part) - self.block("selective", part) + self.core_qkv_copies(part)
                + self.core_output(part) for p, part in zip(policies, parts, strict=True) if p == "selective" and part != "mlp"]
        rerun_i = max([*rerun.values(), *core], default=0.0)
        for sets in range(prefetch + 1):
            # A prefetched I brings its swapped blocks back one after another and they stay until
            # it ends (torch's I keeps the graph; the executor drops its copies then); in a
            # cool-down, the next micro-batch's last one too. Without a prefetch they come back as
            # asked: the largest saved tensor at once. The loss's backward runs in I.
            swap_back = 0.0 if not swap else (
                self.swapped_bytes(policies, parts) + (sets - 1) * last if sets else self.largest_saved_bytes())
            # I ends holding the kept gradients beside its copies, before the executor drops those;
            # its re-runs are gone by then (the accounting counts the gradients at I's end). Without
            # a prefetch each swapped tensor comes back as its operator asks and goes after it, when
            # I has made only the gradients of the groups above (input_pass_walk).
            if swap and not sets:
                redone_i = max(rerun_i, self.input_pass_walk(policies, parts, head_kept))
            else:
                redone_i = max(rerun_i, kept_grads) + swap_back
            transients["I", sets] = (max(redone_i, loss + (last if sets and swap else 0.0)), redone_i)
            # W re-runs the recomputed blocks and asks for its swapped tensors as it goes (I's copies
            # are gone), beside the next I's prefetched last block when that runs under it
            # (gpt-mini ZB-H1 pp4: 1.0 MiB in W, 6.0 MiB in a W before an I, 5.0 MiB in I).
            redone_w = walk_w + sets * last
            transients["W", sets] = (redone_w, redone_w)
        return _StageTerms(acts, sum(layers), max(layers, default=0), transients, acts - logits + until_w,
                           self.swapped_bytes(policies, parts), last, logits, head_grads)

    def _sbh(self) -> float:
        """s·b·h of one micro-batch on this rank (s the rank's share under context parallelism)."""
        return self.plan.rank_seq_len(self.seq_len or self.model.seq_len) * self.plan.micro_batch_size * self.model.hidden_size

    def core_qkv_copies(self, part: BlockPart = "whole") -> float:
        """What a re-run of the eager attention core saves beyond the outputs a policy cached: its
        contiguous copies of q, k and v for the batched GEMMs, (1 + 2r)·d·s·b·h/t with r the K/V
        heads' share (gpt-mini, micro-batch 3: a ``nongemm`` block's re-run 6.0 MiB, a ``selective``
        core's in a split backward's I 2.6 MiB, each 3·d·s·b·h more than with FlashAttention, which
        saves views of the q, k and v it is given; Llama's eager core folds q and transposes k
        as GPT's does: 2·d·s·b·h at r = ½ on a 32-wide Llama, measured with the executor's
        accounting). 0 for an MLP part."""
        model, plan = self.model, self.plan
        if part == "mlp" or plan.flash_attention:
            return 0.0
        return (1 + 2 * model.kv_heads / model.num_heads) * DTYPE_BYTES[plan.precision] * self._sbh() / plan.tp

    def core_output(self, part: BlockPart = "whole") -> float:
        """What a re-run of a ``selective`` block's FlashAttention core makes that the block does not
        hold: the kernel's output, d·s·b·h/t, which the kernel saves for its backward (the block
        holds the forward's, the projection's input). The eager core's output is saved by nothing
        in the re-run. 0 for an MLP part or without FlashAttention."""
        plan = self.plan
        if part == "mlp" or not plan.flash_attention:
            return 0.0
        return DTYPE_BYTES[plan.precision] * self._sbh() / plan.tp

    def swapped_bytes(self, policies: list[BlockPolicy], parts: list[BlockPart]) -> float:
        """Bytes a micro-batch's swapped blocks bring back to the device: what each saves when kept."""
        return sum(self.block("none", part) for p, part in zip(policies, parts, strict=True) if p == "swap")

    def last_swapped_bytes(self, policies: list[BlockPolicy], parts: list[BlockPart]) -> float:
        """Bytes the last swapped block brings back (the one a prefetch copies)."""
        return self.block("none", parts[max(i for i, p in enumerate(policies) if p == "swap")])

    def nongemm_unshared(self, part: BlockPart = "whole") -> float:
        """Bytes a ``nongemm`` block keeps that a kept block does not save: the outputs of the GEMMs
        before a residual add (the projection's; fc2's with dropout), which nothing else keeps.
        A re-run re-saves the rest of ``block("none")`` on top of what the block kept."""
        n = (part != "mlp") + (1 if self.model.dropout and part != "attention" else 0)
        return n * DTYPE_BYTES[self.plan.precision] * self._sbh()

    def largest_saved_bytes(self) -> float:
        """The largest single tensor a block saves, one micro-batch: the softmax output
        (:meth:`core_saved_bytes`) or the GeLU input (FlashAttention saves no softmax output: the GeLU input)."""
        model, plan = self.model, self.plan
        s, b, t, d = plan.rank_seq_len(self.seq_len or model.seq_len), plan.micro_batch_size, plan.tp, DTYPE_BYTES[plan.precision]
        return max(0.0 if plan.flash_attention else self.core_saved_bytes(), d * b * s * model.ffn / t)

    def rerun_bytes(self, part: BlockPart = "whole") -> float:
        """What a recomputed block (or part) re-saves for its backward: all of ``block("none")`` but
        its input, which its first operator saves again from the storage the block holds
        (``block("full")``), no new memory."""
        return self.block("none", part) - self.block("full", part)

    def _back_bytes(self, policy: BlockPolicy, part: BlockPart) -> float | None:
        """What a redone block (or part) brings back at once before its backward; None for a block
        that stays saved (:meth:`redone_bytes`)."""
        if policy == "full":
            return self.rerun_bytes(part)
        if policy == "nongemm":
            # Everything a kept block saves but the cached GEMM outputs and the input it holds.
            cached = self.block(policy, part) - self.block("full", part) - self.nongemm_unshared(part)
            return self.rerun_bytes(part) - cached + self.core_qkv_copies(part)
        if policy == "swap":
            return self.largest_saved_bytes()
        return None

    def redone_bytes(self, policies: list[BlockPolicy], parts: list[BlockPart], head_bytes: float, *,
                     prefetch: int = 0) -> float:
        """What a recomputed or swapped-in block adds on top of the stage's held activations.

        A recomputed block comes back whole but its input (:meth:`rerun_bytes`: the recompute
        re-saves it all before its backward starts, the input from the storage the block holds); a
        swapped one as below. The backward runs the stage's layers last to first and frees each one's activations as it
        goes, so when block j is back the micro-batch has already released the head's extras and
        every block after j: block j adds ``max(0, back − Σ after j)``; the stage's transient is the
        largest over its redone blocks (measured on CPU with the executor's live-tensor accounting).
        A ``nongemm`` block re-saves all of ``block("none")`` but the GEMM outputs it cached
        (what it keeps less its input and :meth:`nongemm_unshared`). A block cut by a stage boundary counts the part the stage holds.

        A swapped block comes back storage by storage as the backward asks for it (the executor's
        unpack hook), so at most its largest saved tensor is back at once — except where the stage
        prefetches (``prefetch`` ≥ 1, :meth:`~mindpipe.simulator.actions.Schedule.prefetched_sets`;
        the executor's chain, :func:`~mindpipe.executor.offload.install_prefetch`): its last
        swapped block comes back whole while the action before the backward runs, and each other
        one while the swapped block above it runs its backward. So when block j runs, its own
        bytes (re-run, or swapped back whole) and the next swapped block below the nearest swapped
        one at or above j are on top of the held activations, less what the backward freed; with
        ``prefetch`` = 2 (1F1B's cool-down) the next micro-batch's last swapped block too, from
        this backward's first swapped block on (the executor defers that prefetch until then).
        """
        if prefetch and "swap" in policies:
            return self._swap_walk(policies, parts, head_bytes, prefetch)
        out, after = 0.0, head_bytes
        for p, part in zip(reversed(policies), reversed(parts), strict=True):
            back = self._back_bytes(p, part)
            if back is not None:
                out = max(out, back - after)
            after += self.block(p, part)
        return out

    def _swap_walk(self, policies: list[BlockPolicy], parts: list[BlockPart], head_bytes: float, prefetch: int) -> float:
        """:meth:`redone_bytes` of a stage with swapped blocks."""
        swapped = [i for i, p in enumerate(policies) if p == "swap"]
        full = {i: self.block("none", parts[i]) for i in swapped}
        below = swapped_below(swapped)
        top = swapped[-1]
        out, after = full[top], head_bytes  # before the backward: its prefetched last swapped block
        nearest: int | None = None  # the nearest swapped block at or above i
        for i in reversed(range(len(policies))):
            # in a cool-down, the next micro-batch's last swapped block from this one's first swapped block on
            extra = (prefetch - 1) * full[top] if i <= swapped[0] else 0.0
            p, part = policies[i], parts[i]
            if p == "swap":
                nearest = i
            # No swapped block at or above i: the last one (below i) is back, prefetched; else the next
            # swapped block below the nearest one is coming back.
            nxt = full[top] if nearest is None else full.get(below.get(nearest, -1), 0.0)
            own = full[i] if p == "swap" else self._back_bytes(p, part) or 0.0
            out = max(out, extra + own + nxt - after)
            after += self.block(p, part)
        return out

    def _evaluator(self, terms: dict[int, _StageTerms]) -> tuple[Callable[[dict[int, Held]], _Point], Callable[[_Next], float]]:
        """What :meth:`rank` and :meth:`by_action` evaluate at a point of a rank's timeline: ``point``
        (its activations, gradients, what runs next and the gathered weights freed by then) and
        ``extra`` (what that next action adds: its transient, or a forward's gathered layers)."""
        plan = self.plan
        grads_of = {s: model_state_bytes(t.params, plan)[1] for s, t in terms.items()}
        # After a stage's last backward its gradients are reduced: a sharding wrapper keeps its shard.
        shards = plan.grad_replicas if shards_reduced_gradients(plan) else 1
        reduced_of = {s: min(grads_of[s], t.params * GRAD_BYTES[plan.precision] / shards) for s, t in terms.items()}
        # A backward's transient (a re-materialised block, the loss's gradients) sits on top of what
        # is held when it starts: in 1F1B's steady state the oldest micro-batch's backward runs
        # while the newest forward's activations are still held. It is the transient of the backward
        # that comes next (Held.backward_next: its stage, its kind and what is prefetched beside it;
        # per action, not one figure per stage), at that point of the timeline.
        # FSDP2 gathers a stage's whole weights at its first forward and frees them where it reduces
        # the stage's gradients (torch's perform_reduce_grad reshards): on a rank of several stages,
        # while the others still run (measured on gpt-mini ZB-V dp2 pp2, ZeRO 0-3: 5.0 MiB less from
        # there on; llama-tiny ZB-V: stage 3's 0.31 MiB only from its first forward).
        gathered_of = {s: t.params * DTYPE_BYTES[plan.precision] if keeps_gathered_weights(plan) else 0.0
                       for s, t in terms.items()}

        def point(h: dict[int, Held]) -> _Point:
            acts = sum(x.awaiting_input * terms[s].per_microbatch_bytes + x.awaiting_weight * terms[s].after_input_bytes
                       for s, x in h.items())
            grads = sum(((reduced_of if x.grads_reduced else grads_of)[s] for s, x in h.items() if x.has_grads), 0.0)
            # a fused head's gradients, made by the first I before the stage's first W makes the rest
            grads += sum((terms[s].head_grad_bytes for s, x in h.items() if not x.has_grads and x.awaiting_weight), 0.0)
            # gathered from the stage's first forward until its gradients are reduced
            freed = sum((gathered_of[s] for s, x in h.items()
                         if x.grads_reduced or not (x.awaiting_input or x.awaiting_weight or x.has_grads)), 0.0)
            # what runs next: a backward's context, else a forward (False) or nothing (True: the step's end)
            return acts, grads, next(((s, x.next_kind, x.next_sets, x.next_across,
                                       not (x.has_grads or x.awaiting_weight)) for s, x in h.items()
                                      if x.backward_next), any(x.step_done for x in h.values())), freed

        reshards = reshards_after_forward(plan)
        # FSDP-style: the layer being computed and the prefetched next one are gathered whole —
        # during a block's forward or backward (a recomputed block's re-run included), not at the
        # loss: FSDP2 frees the stage's gathered weights when its forward ends (measured on CPU).
        gathered = 2 * max(t.largest_layer_params for t in terms.values()) * DTYPE_BYTES[plan.precision] if reshards else 0.0

        def extra(ctx: _Next) -> float:
            if isinstance(ctx, bool):  # a forward gathers its layers; at the step's end nothing is gathered
                return 0.0 if ctx else gathered
            s, kind, sets, across, first = ctx
            transient, redone = terms[s].transient(kind, sets)
            # Another stage's next backward prefetched under this one: its last swapped block is back
            # beside this one's transient (Schedule.prefetched_across; measured on llama-tiny
            # interleaved pp2: 0.9 MiB under stage 3's last B, not under its first).
            beside = terms[across].last_swapped_bytes if across in terms else 0.0
            # A fused head's gradients exist once the loss's backward is done: beside the blocks' re-runs,
            # not at the loss's own peak (gpt-mini cp2 ZB-H1, the first I: the loss's temporaries alone).
            if first and kind in ("B", "I"):
                redone += terms[s].head_grad_bytes
                transient = max(transient, redone)
            return max(gathered + (redone + beside if reshards else 0.0), transient + beside)

        return point, extra

    def rank(self, rank: int, terms: dict[int, _StageTerms], held: list[dict[int, Held]]) -> RankMemory:
        """Peak memory of a pipeline rank holding the stages of ``terms`` (virtual stage → terms).

        ``held`` is the rank's :meth:`Schedule.held_timeline` (or its distinct states,
        :meth:`Schedule.held_states`): per stage after each of its actions, micro-batches awaiting
        their input gradient, micro-batches awaiting their W, and whether the stage's weight
        gradients exist yet. The peak is over that timeline of the activations
        plus the gradients that exist at that point (torch allocates them in the first backward and
        frees them at the step), so a warm-up's forwards hold no gradients. The gradients of the
        first backward, allocated while it frees the activations, are left out as the executor's
        accounting leaves them out (it re-reads them after each backward action): on a GPU the
        allocator's peak can be higher by part of them.
        """
        plan, (point, extra) = self.plan, self._evaluator(terms)
        # Ties in the total (a split backward's I beside its kept gradients against the W after it)
        # go to the point holding more activations, so the breakdown does not depend on the order
        # of ``held`` (a timeline, or its distinct states).
        acts, grads, redo, freed = max((point(h) for h in held), key=lambda x: (x[0] + x[1] + extra(x[2]) - x[3], x[0]),
                                       default=(0.0, 0.0, True, 0.0))
        weights, _, optim = model_state_bytes(sum(t.params for t in terms.values()), plan)
        weights -= freed
        other = self.reserve + extra(redo)
        total = weights + grads + optim + acts + other
        cap = float(self.device.memory_capacity_bytes)
        # The host holds each swapped micro-batch's copies until its backward (W) has used them.
        host = max((sum((x.awaiting_input + x.awaiting_weight) * terms[s].host_bytes for s, x in h.items())
                    for h in held), default=0.0)
        host_cap = self.device.host_memory_bytes
        rm = RankMemory(weights_bytes=weights, gradients_bytes=grads, optimizer_bytes=optim, activations_bytes=acts,
                        other_bytes=other, total_bytes=total, rank=rank, capacity_bytes=cap, fits=False, host_bytes=host,
                        host_capacity_bytes=None if host_cap is None else float(host_cap))
        return dataclasses.replace(rm, fits=rm.fits_device and rm.fits_host)


    def by_action(self, terms: dict[int, _StageTerms], timeline: list[dict[int, Held]], order: list[Action],
                  lazy: Collection[int] = ()) -> list[float]:
        """Per action of the rank's ``order``, the device bytes at their peak while it runs — the
        figure the executor records per action (``ActionRecord.memory_bytes``). A backward: what is
        held when it starts plus its transient (:meth:`rank`'s points, action by action); a forward:
        what is held once its activations exist but the loss's (its forward runs after F), its
        gathered layers, and the last swapped block of a backward prefetched under it. ``timeline`` is :meth:`Schedule.held_timeline`, with ``lazy``."""
        point, extra = self._evaluator(terms)
        weights, _, optim = model_state_bytes(sum(t.params for t in terms.values()), self.plan)
        base = weights + optim + self.reserve
        start = {s: Held(0, 0, False) for s in terms}
        out = []
        for i, a in enumerate(order):
            if a.kind == "F":
                acts, grads, _, freed = point(timeline[i])
                nxt = prefetched_backward(order, i, lazy)
                ahead = terms[nxt.stage].last_swapped_bytes if nxt is not None and nxt.stage in terms else 0.0
                loss = terms[a.stage].loss_kept_bytes  # saved after F, by the loss's forward
                out.append(base + acts + grads - freed + extra(False) + ahead - loss)
            else:
                acts, grads, ctx, freed = point(timeline[i - 1] if i else start)
                out.append(base + acts + grads - freed + extra(ctx))
        return out

def stage_memory(
    model: Model,
    plan: Plan,
    device: DeviceSpec,
    schedule: Schedule,
    stage_layers: list[int],
    *,
    reserved_bytes: float | None = None,
    seq_len: int | None = None,
) -> list[RankMemory]:
    """Peak memory of every pipeline rank under ``schedule``.

    Activations: stage s holds, per in-flight micro-batch, its blocks' bytes (each under its
    policy, :func:`mindpipe.traces.layout.block_policies`) plus the embedding extras on stage 0 and
    the head extras on the last stage. A rank's peak is the maximum over its action order of
    Σ_s in_flight_s × bytes_s (:meth:`Schedule.in_flight_timeline`), so unequal chunks and V
    placements are weighted right; for 1F1B stage s of p holds min(p − s, m) micro-batches, and
    the first stage holds L × per-layer bytes for any p (Korthikanti §4.3).

    Args:
        model, plan: The model and plan.
        device: Capacity comes from here; a CPU keeps dtype-sized dropout masks and no reserve.
        schedule: Per-rank orders (from :func:`mindpipe.simulator.schedules.build_schedule`).
        stage_layers: Transformer blocks on each virtual stage.
        reserved_bytes: Framework overhead per rank (default ``GPU_RESERVED_BYTES`` on a GPU, 0
            on a CPU).
        seq_len: Sequence length if not the model's.

    Raises:
        ContractError: stage layers or policies that do not match the model, plan and schedule.
    """
    mm, terms, lazy = _plan_terms(model, plan, device, schedule, stage_layers, reserved_bytes, seq_len)
    return [mm.rank(r, {s: terms[s] for s in schedule.stages_of_rank(r)}, schedule.held_states(r, lazy))
            for r in range(schedule.pp)]


def _plan_terms(model: Model, plan: Plan, device: DeviceSpec, schedule: Schedule, stage_layers: list[int],
                reserved_bytes: float | None, seq_len: int | None) -> tuple[StageMemoryModel, list[_StageTerms], frozenset[int]]:
    """The memory model of a plan, its stages' terms and its lazy stages (:func:`stage_memory`)."""
    _check(model, plan, schedule, stage_layers)
    mm = StageMemoryModel(model, plan, device, reserved_bytes, seq_len, split_backward=schedule.split_backward)
    policies = block_policies(plan, model.num_layers)
    # Which blocks (and parts of blocks) each stage holds is the layout's rule, on these stage layers.
    spans = stage_layout(dataclasses.replace(plan, partition=list(stage_layers)), model)
    lazy = frozenset(lazy_copy_back(plan))
    own = [([policies[b] for b in span.blocks], [span.part(b) for b in span.blocks]) for span in spans]
    prefetch = [schedule.prefetched_sets(s, lazy) for s in range(len(spans))]
    return mm, [mm.stage(pols, span.has_embedding, span.has_head, parts, prefetch=prefetch[s])
                for s, (span, (pols, parts)) in enumerate(zip(spans, own, strict=True))], lazy


def memory_by_action(model: Model, plan: Plan, device: DeviceSpec, schedule: Schedule, stage_layers: list[int], *,
                     reserved_bytes: float | None = None, seq_len: int | None = None) -> list[list[float]]:
    """Per pipeline rank, per action of its order in ``schedule``: the device bytes at their peak
    while the action runs (:meth:`StageMemoryModel.by_action`); the largest of a rank's is at most
    :func:`stage_memory`'s total, which may sit between actions (after the last backward, once its
    gradients exist). What the executor records per action (``ActionRecord.memory_bytes``)."""
    mm, terms, lazy = _plan_terms(model, plan, device, schedule, stage_layers, reserved_bytes, seq_len)
    return [mm.by_action({s: terms[s] for s in schedule.stages_of_rank(r)}, schedule.held_timeline(r, lazy),
                         schedule.orders[r], lazy) for r in range(schedule.pp)]


def plan_memory(
    model: Model, plan: Plan, device: DeviceSpec, *, reserved_bytes: float | None = None, seq_len: int | None = None
) -> list[RankMemory]:
    """:func:`stage_memory` with the plan's own schedule (``build_schedule``) and partition."""
    schedule = build_schedule(plan.schedule, plan.pp, plan.num_microbatches, plan.virtual_stages)
    return stage_memory(
        model, plan, device, schedule, plan_stage_layers(plan, model), reserved_bytes=reserved_bytes, seq_len=seq_len
    )


def peak_memory_gib(
    model: Model, plan: Plan, device: DeviceSpec, *, reserved_bytes: float | None = None, seq_len: int | None = None
) -> float:
    """Largest per-rank total of :func:`plan_memory`, in GiB."""
    mem = plan_memory(model, plan, device, reserved_bytes=reserved_bytes, seq_len=seq_len)
    return max(rm.total_bytes for rm in mem) / GIB


def fits_in_memory(
    model: Model, plan: Plan, device: DeviceSpec, *, reserved_bytes: float | None = None, seq_len: int | None = None
) -> bool:
    """True when every pipeline rank of the plan fits in the device's memory."""
    return all(rm.fits for rm in plan_memory(model, plan, device, reserved_bytes=reserved_bytes, seq_len=seq_len))


__all__ = [
    "CUBLAS_THREADS",
    "DEFAULT_CUBLAS_WORKSPACE_BYTES",
    "FLASH_STAT_BYTES",
    "FP8_WEIGHT_CACHE_BYTES",
    "GEMM_INPUT_BYTES",
    "GPU_RESERVED_BYTES",
    "OPTIMIZER_BYTES",
    "RankMemory",
    "StageMemoryModel",
    "activation_bytes_per_layer",
    "allocator_overhead_bytes",
    "embedding_activation_bytes",
    "fits_in_memory",
    "head_activation_bytes",
    "head_input_bytes",
    "head_logit_bytes",
    "logit_count",
    "loss_transient_bytes",
    "memory_by_action",
    "model_state_bytes",
    "peak_memory_gib",
    "plan_memory",
    "stage_memory",
]
