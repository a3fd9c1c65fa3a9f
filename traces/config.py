"""Model, cluster and plan contracts (DESIGN.md "Data contracts").

Each is a dataclass validated in ``__post_init__`` (torchtitan's pattern) and read from JSON with
:func:`mindpipe.traces.schema.from_dict`, so unknown keys and impossible values raise a
:class:`~mindpipe.traces.errors.ContractError` naming the file, the key and the rule. Rules that involve
more than one document (plan vs model vs cluster) live in :func:`check_plan`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from mindpipe.traces.catalog import check_precision
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import integer, number, shown, within_limit
from mindpipe.traces.schedule_rules import (
    SCHEDULES,
    fixed_virtual_stages,
    microbatch_rule,
    runtime_microbatch_rule,
    virtual_stages_rule,
)
from mindpipe.traces.schema import check_format_version
from mindpipe.traces.units import plural
from mindpipe.traces.what_if import WHAT_IF_KEYS

MODEL_FORMAT_VERSION = 1
CLUSTER_FORMAT_VERSION = 1
PLAN_FORMAT_VERSION = 1

MODEL_KINDS = ("gpt", "llama")
# Llama's rotary base when a model file leaves it out (Hugging Face LlamaConfig's default; Llama 3 sets 500000).
DEFAULT_ROPE_THETA = 10000.0
RECOMPUTE = ("none", "selective", "full")
PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
COMM_PRIORITIES = ("fair", "pp_first")
# How context parallelism exchanges K and V (Megatron-core ``--cp-comm-type``): ``allgather`` (Llama 3:
# K and V gathered before the attention kernels) or ``p2p`` (Transformer Engine's ring, the exchange
# pipelined under the attention kernels); the executor runs both (traces.torch_context_parallel).
CP_COMM_TYPES = ("allgather", "p2p")
# A plan's ``cp_comm_type`` when it does not give one: the only value a plan with cp=1 may hold.
CP_COMM_DEFAULT = "allgather"
# How data parallelism runs (``Plan.dp_impl``; the rules are :mod:`mindpipe.traces.layout`'s): the
# executor's FSDP2, or Megatron-LM's DDP and distributed optimizer (a what-if knob).
DP_IMPLS = ("fsdp2", "megatron")
LAYER_MEMORY_POLICIES = ("keep", "selective", "nongemm", "recompute", "swap")
# Where a stage boundary falls (``Plan.stage_cuts``; the rule is :mod:`mindpipe.traces.layout`'s):
# between two blocks, or inside the stage's last block after its attention sub-layer's residual add.
STAGE_CUTS = ("between_blocks", "after_attention")
# How a stage's swapped activations come back for a backward (``Plan.swap_copy_back``; the rule is
# :func:`mindpipe.simulator.actions.prefetched_backward`'s): ahead of it (vPipe), or as it asks for them.
SWAP_COPY_BACK = ("prefetch", "lazy")
# How global ranks are laid out over (tp, dp, pp), innermost first; Megatron's default is tp-dp-pp.
RANK_ORDERS = ("tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp")
# Supernet schedules (NASPipe; :mod:`mindpipe.simulator.subnet_schedules` owns what each does).
SUBNET_SCHEDULES = ("csp", "sequential", "sync", "async")
# The ones whose training equals sequential training bit for bit (sync and async do not).
SEQUENTIAL_EQUIVALENT_SCHEDULES = ("csp", "sequential")


def positive(key: str, value: int | float) -> None:
    """Raise unless ``value`` is a finite number > 0."""
    number(key, value)
    if value <= 0:
        raise ContractError("", key, f"{key}={value} must be > 0")


def non_negative(key: str, value: int | float | None) -> None:
    """Raise unless ``value`` is None or a finite number >= 0."""
    if value is not None:
        number(key, value, 0)


def one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    """Raise unless ``value`` is one of ``allowed``."""
    if not isinstance(value, str) or value not in allowed:
        raise ContractError("", key, f"{key}={shown(value)} is not one of {', '.join(allowed)}")


@dataclass
class Model:
    """A decoder-only transformer: GPT-style (``kind: "gpt"``) or Llama-style (``kind: "llama"``).

    ``gpt``: pre-LN, LayerNorms and linears with biases, learned positions, GeLU MLP (two
    matrices h×f), untied LM head unless ``tie_embeddings``, multi-head attention. ``llama`` (Touvron et al. 2023; Llama 3,
    Dubey et al. 2024): RMSNorm (one weight vector), no biases, rotary positions (no position
    embedding), SwiGLU MLP (three matrices h×f), grouped-query attention with ``num_kv_heads``
    key/value heads, untied LM head unless ``tie_embeddings``.

    Attributes:
        kind: Model family, ``"gpt"`` or ``"llama"``.
        num_layers: Transformer blocks.
        hidden_size: Model width h.
        num_heads: Attention (query) heads a (must divide h).
        seq_len: Sequence length s.
        vocab_size: Vocabulary V.
        ffn_hidden_size: MLP width; ``None`` means 4·h (gpt only: a llama model must give its SwiGLU width).
        dropout: Dropout probability used in attention and after each residual branch (0 for llama).
        num_kv_heads: Key/value heads (grouped-query attention; must divide ``num_heads``). ``None``
            means ``num_heads`` (multi-head attention, Hugging Face's ``num_key_value_heads``
            default); a gpt model may only state that value.
        rope_theta: Rotary base (llama only; ``None`` means :data:`DEFAULT_ROPE_THETA`).
        tie_embeddings: The LM head reuses the token embedding (Megatron-LM's GPT default; Llama 3.2
            1B/3B). Under pipelining the last stage holds a copy (:func:`mindpipe.traces.layout.tied_table_ranks`).
        name: Optional label (built-in models carry their name).
    """

    kind: str
    num_layers: int
    hidden_size: int
    num_heads: int
    seq_len: int
    vocab_size: int
    ffn_hidden_size: int | None = None
    dropout: float = 0.0
    num_kv_heads: int | None = None
    rope_theta: float | None = None
    tie_embeddings: bool = False
    name: str | None = None
    format_version: int = MODEL_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self.format_version, MODEL_FORMAT_VERSION, "models")
        one_of("kind", self.kind, MODEL_KINDS)
        for key in ("num_layers", "hidden_size", "num_heads", "seq_len", "vocab_size"):
            integer(key, getattr(self, key), 1, key)
        if self.ffn_hidden_size is not None:
            integer("ffn_hidden_size", self.ffn_hidden_size, 1, "ffn_hidden_size")
        number("dropout", self.dropout)
        if self.hidden_size % self.num_heads:
            raise ContractError(
                "", "num_heads", f"num_heads={self.num_heads} does not divide hidden_size={self.hidden_size}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ContractError("", "dropout", f"dropout={self.dropout} must be in [0, 1)")
        self._check_family()

    def _check_family(self) -> None:
        """The keys that depend on ``kind``: GQA, rotary base, tied embeddings, SwiGLU width, dropout."""
        if self.num_kv_heads is not None:
            integer("num_kv_heads", self.num_kv_heads, 1, "num_heads")
            if self.num_heads % self.num_kv_heads:
                raise ContractError("", "num_kv_heads",
                                    f"num_kv_heads={self.num_kv_heads} does not divide num_heads={self.num_heads}")
        if self.rope_theta is not None:
            positive("rope_theta", self.rope_theta)
        if not isinstance(self.tie_embeddings, bool):
            raise ContractError("", "tie_embeddings", f"tie_embeddings={shown(self.tie_embeddings)} must be true or false")
        if self.kind == "llama":
            if self.head_dim % 2:
                # Rotary embeddings turn channel pairs (i, i + d/2) (Su et al. 2021; HF rotate_half).
                raise ContractError("", "num_heads", f"head width hidden_size/num_heads={self.hidden_size}/"
                                                     f"{self.num_heads}={self.head_dim} must be even for kind llama "
                                                     "(rotary embeddings rotate pairs of channels)")
            if self.ffn_hidden_size is None:
                raise ContractError("", "ffn_hidden_size", "ffn_hidden_size is required for kind llama (the SwiGLU width)")
            if self.dropout:
                raise ContractError("", "dropout", f"dropout={self.dropout}: llama models have no dropout (use 0)")
            return
        if self.kv_heads != self.num_heads:
            raise ContractError("", "num_kv_heads", f"num_kv_heads={self.num_kv_heads} applies to llama models only "
                                                    f"(gpt uses multi-head attention: num_kv_heads = num_heads)")
        if self.rope_theta is not None:
            raise ContractError("", "rope_theta", f"rope_theta applies to llama models only (model kind is {self.kind!r})")

    @property
    def is_llama(self) -> bool:
        """True for the Llama family (RMSNorm, SwiGLU, RoPE, GQA, no biases)."""
        return self.kind == "llama"

    @property
    def kv_heads(self) -> int:
        """Key/value heads (``num_kv_heads`` or ``num_heads``)."""
        return self.num_kv_heads if self.num_kv_heads is not None else self.num_heads

    @property
    def rope_base(self) -> float:
        """Rotary base θ (``rope_theta`` or :data:`DEFAULT_ROPE_THETA`)."""
        return self.rope_theta if self.rope_theta is not None else DEFAULT_ROPE_THETA

    @property
    def ffn(self) -> int:
        """MLP width (``ffn_hidden_size`` or 4·h)."""
        return self.ffn_hidden_size if self.ffn_hidden_size is not None else 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        """Per-head width h/a."""
        return self.hidden_size // self.num_heads

    @property
    def label(self) -> str:
        """The name if any, else a compact shape description."""
        return self.name or f"{self.kind}-L{self.num_layers}-h{self.hidden_size}"

    @property
    def kv_width(self) -> int:
        """Width of the K (and of the V) projection: num_kv_heads × head_dim (h under multi-head attention)."""
        return self.kv_heads * self.head_dim

    def norm_param_count(self) -> int:
        """One norm's parameters: a LayerNorm's weight and bias (2h), or an RMSNorm's weight (h)."""
        return self.hidden_size if self.is_llama else 2 * self.hidden_size

    def attention_param_count(self) -> int:
        """Parameters of a block's attention sub-layer, norm included.

        gpt: LayerNorm (2h), QKV with bias (3h² + 3h), projection with bias (h² + h). llama:
        RMSNorm (h), Q and output projections (2h²), K and V (2·h·kv·h/a), no biases.
        """
        h, norm = self.hidden_size, self.norm_param_count()
        if self.is_llama:
            return norm + 2 * h * h + 2 * h * self.kv_width
        return norm + (3 * h * h + 3 * h) + (h * h + h)

    def mlp_param_count(self) -> int:
        """Parameters of a block's MLP sub-layer, norm included.

        gpt: LayerNorm (2h), fc1 and fc2 with biases (2hf + f + h). llama: RMSNorm (h), SwiGLU's
        gate, up and down matrices (3hf), no biases.
        """
        h, f, norm = self.hidden_size, self.ffn, self.norm_param_count()
        if self.is_llama:
            return norm + 3 * h * f
        return norm + (h * f + f) + (f * h + h)

    def block_param_count(self) -> int:
        """Parameters of one block (its attention and MLP sub-layers)."""
        return self.attention_param_count() + self.mlp_param_count()

    def embedding_param_count(self) -> int:
        """Token embedding (V·h), plus learned positions (s·h) for gpt."""
        h = self.hidden_size
        return self.vocab_size * h + (0 if self.is_llama else self.seq_len * h)

    def final_norm_param_count(self) -> int:
        """The final norm: LayerNorm weight and bias (2h), or an RMSNorm weight (h)."""
        return self.norm_param_count()

    def lm_head_param_count(self) -> int:
        """The LM head's own parameters: V·h, or 0 when tied to the token embedding."""
        return 0 if self.tie_embeddings else self.vocab_size * self.hidden_size

    def param_count(self) -> int:
        """All parameters: embedding, blocks, final norm and LM head (counted once when tied).

        Llama 3 8B / 70B / 405B give 8,030,261,248 / 70,553,706,496 / 405,853,388,800
        (Meta's published 8.03B, 70.6B, 405.9B).
        """
        return (self.embedding_param_count() + self.num_layers * self.block_param_count()
                + self.final_norm_param_count() + self.lm_head_param_count())

    def describe(self) -> str:
        """The label and the shape: ``gpt-mini (num_layers=4, hidden_size=256, ...)``."""
        kv = f", num_kv_heads={self.kv_heads}" if self.kv_heads != self.num_heads else ""
        return (f"{self.label} (num_layers={self.num_layers}, hidden_size={self.hidden_size}, "
                f"num_heads={self.num_heads}{kv}, seq_len={self.seq_len}, vocab_size={self.vocab_size})")

    def same_shape(self, other: Model) -> bool:
        """True when both describe the same network (names and format ignored)."""
        keys = ("kind", "num_layers", "hidden_size", "num_heads", "seq_len", "vocab_size", "ffn", "dropout",
                "kv_heads", "rope_base", "tie_embeddings")
        return all(getattr(self, k) == getattr(other, k) for k in keys)


@dataclass
class Cluster:
    """A homogeneous GPU (or CPU) cluster.

    Attributes:
        gpu: Device name in the hardware catalog (``traces/hardware/catalog.json``).
        num_nodes: Nodes.
        gpus_per_node: Devices per node (ranks per node on CPU).
        intra_node_bandwidth_GBps: Per-device intra-node bandwidth override (GB/s, one direction).
        inter_node_bandwidth_Gbps: Per-node inter-node bandwidth override (Gbit/s).
        pue: Power usage effectiveness of the facility (1.0 = no overhead, CodeCarbon's default).
        region: Grid region for carbon accounting (e.g. ``"US-CAL-CISO"``), or None.
    """

    gpu: str
    num_nodes: int = 1
    gpus_per_node: int = 8
    intra_node_bandwidth_GBps: float | None = None
    inter_node_bandwidth_Gbps: float | None = None
    pue: float = 1.0
    region: str | None = None
    name: str | None = None
    format_version: int = CLUSTER_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self.format_version, CLUSTER_FORMAT_VERSION, "clusters")
        integer("num_nodes", self.num_nodes, 1, "num_nodes")
        integer("gpus_per_node", self.gpus_per_node, 1, "gpus_per_node")
        within_limit("num_nodes", self.world_size, "devices", "num_nodes×gpus_per_node")
        for key in ("intra_node_bandwidth_GBps", "inter_node_bandwidth_Gbps"):
            value = getattr(self, key)
            if value is not None:
                positive(key, value)
                within_limit(key, value, "bandwidth")
        number("pue", self.pue, 1.0, "pue")
        if not isinstance(self.gpu, str):
            raise ContractError("", "gpu", f"gpu={shown(self.gpu)} must be a device name")
        from mindpipe.traces.catalog import get_device  # local import: catalog is data, loaded on demand

        try:
            device = get_device(self.gpu)
        except ContractError as e:
            raise ContractError("", "gpu", e.rule) from None
        if self.num_nodes > 1 and self.inter_node_bandwidth_Gbps is None and not device.nic_bandwidth_Gbps > 0:
            # Nothing would price the links between the nodes (a CPU host has no NIC in the catalog).
            raise ContractError("", "inter_node_bandwidth_Gbps", f"num_nodes={self.num_nodes} needs "
                                f"inter_node_bandwidth_Gbps (Gbit/s per node): the catalog gives {self.gpu} no NIC")

    @property
    def world_size(self) -> int:
        """Total devices."""
        return self.num_nodes * self.gpus_per_node


@dataclass
class MadeFor:
    """What a plan was made for: ``mindpipe tune`` writes it into ``best_plan.json``.

    ``mindpipe run`` takes the model from here when ``--model`` is not given, and refuses a run
    that does not match (another model, another number of devices) with the reason stated here.
    A supernet plan names its supernet in ``supernet`` and leaves ``model`` null (exactly one is set).

    Attributes:
        model: The GPT model the plan was tuned for (None for a supernet plan).
        cluster: The cluster it was tuned for (device, nodes, devices per node).
        tool: What wrote it.
        trace: The trace the tuner priced compute with (its file or name and a content hash), if any.
        calibration: The calibration it was tuned with (file and content hash), if any.
        what_if: Plan keys set to values only the simulator models (what-if knobs): the executor
            does not carry them out, so a run of this plan will not match its simulation there.
        supernet: The supernet a supernet plan was tuned for (NASPipe; None for a GPT plan).
    """

    model: Model | None
    cluster: Cluster
    tool: str = "mindpipe tune"
    trace: str | None = None
    calibration: str | None = None
    what_if: list[str] = field(default_factory=list)
    supernet: _supernet_contract.Supernet | None = None

    def __post_init__(self) -> None:
        if (self.model is None) == (self.supernet is None):
            raise ContractError("", "model", "made_for names either a GPT model (model) or a supernet "
                                "(supernet, with model null), exactly one of them")

    @property
    def label(self) -> str:
        """The model's or the supernet's label."""
        net = self.model if self.model is not None else self.supernet
        return net.label if net is not None else ""

    def describe(self) -> str:
        """E.g. ``gpt-13b on a100-sxm4-80gb:8x8 (64 devices)``."""
        c = self.cluster
        where = c.name or f"{c.gpu}:{c.num_nodes}x{c.gpus_per_node}"
        return f"{self.label} on {where} ({c.world_size} device{'s' if c.world_size != 1 else ''})"


_PLAN_INTEGER_LIMITS = {"dp": "devices", "tp": "devices", "pp": "devices", "cp": "devices", "micro_batch_size": "micro_batch_size",
                        "global_batch_size": "global_batch_size", "virtual_stages": "virtual_stages",
                        "subnet_window": "subnet_window", "loss_chunks": "loss_chunks"}
_PLAN_CHOICES = {"schedule": SCHEDULES, "recompute": RECOMPUTE, "precision": PRECISIONS,
                 "comm_priority": COMM_PRIORITIES, "rank_order": RANK_ORDERS, "subnet_schedule": SUBNET_SCHEDULES,
                 "cp_comm_type": CP_COMM_TYPES, "dp_impl": DP_IMPLS}
# Keys that only supernet plans set; None in every GPT plan (:func:`mindpipe.traces.supernet.check_supernet_plan`).
SUPERNET_PLAN_KEYS = ("subnet_schedule", "subnet_window")
_PLAN_BOOL_KEYS = ("sequence_parallel", "overlap_grad_reduce", "tp_comm_overlap", "overlap_param_gather", "flash_attention",
                   "blocking_p2p", "fused_head_loss", "fused_elementwise")
PLAN_SCALAR_KEYS = (*_PLAN_INTEGER_LIMITS, *_PLAN_BOOL_KEYS, *_PLAN_CHOICES, "zero_stage")
"""The plan keys whose rule holds on their own (:func:`check_plan_key`); the rules between keys are :class:`Plan`'s."""


def check_plan_key(key: str, value: Any) -> None:
    """The rule of one scalar plan key on its own: its type, range and limit, or its choices.

    :class:`Plan` checks every key with it; ``tune --fix KEY=VALUE`` checks a pinned value with it
    before the search space is built.

    Raises:
        ContractError: e.g. ``tp=0 must be > 0`` or ``zero_stage=7 must be 0, 1, 2 or 3`` (source empty).
    """
    if key in SUPERNET_PLAN_KEYS and value is None:
        return
    if key in _PLAN_INTEGER_LIMITS:
        integer(key, value, 1, _PLAN_INTEGER_LIMITS[key])
    elif key in _PLAN_BOOL_KEYS:
        if not isinstance(value, bool):
            raise ContractError("", key, f"{key}={shown(value)} must be true or false")
    elif key in _PLAN_CHOICES:
        one_of(key, value, _PLAN_CHOICES[key])
    elif key == "zero_stage":
        if isinstance(value, bool) or value not in (0, 1, 2, 3):
            raise ContractError("", "zero_stage", f"zero_stage={shown(value)} must be 0, 1, 2 or 3")
    else:
        raise KeyError(key)


@dataclass
class Plan:
    """How to parallelise one training iteration.

    ``partition`` lists layers per (virtual) stage in pipeline order; ``None`` means an even split.
    ``layer_memory_policy`` gives per block ``keep|selective|nongemm|recompute|swap`` (vPipe; DawnPiper adds the
    operator-level ``selective`` and ``nongemm``, :mod:`mindpipe.traces.layout`); ``None`` follows
    ``recompute``. ``comm_priority`` ``pp_first`` gives pipeline p2p traffic priority on shared
    links; ``overlap_grad_reduce`` issues data-parallel gradient buckets during the last backward
    (Megatron ``--overlap-grad-reduce``); ``tp_comm_overlap`` pipelines each sequence-parallel
    all-gather/reduce-scatter with the GEMM beside it (Transformer Engine userbuffers, Megatron
    ``--tp-comm-overlap``; the arithmetic is :func:`mindpipe.simulator.collectives.overlapped_exposed_s`);
    ``overlap_param_gather`` issues the ZeRO-1/2 parameter all-gather after the optimizer step
    bucket by bucket under the next iteration's forward (Megatron ``--overlap-param-gather``, NeMo
    ``overlap_param_sync``). All four are what-if knobs (:data:`~mindpipe.traces.what_if.WHAT_IF_KEYS`): their defaults are
    what the executor runs. ``rank_order`` lays global ranks out over the mesh axes,
    innermost first (Megatron: ``tp-dp-pp``, so TP stays inside a node). ``made_for`` names the
    model and cluster a tuned plan was made for (:class:`MadeFor`); hand-written plans leave it out.
    ``stage_cuts`` says, per boundary between consecutive (virtual) stages, whether it falls
    ``between_blocks`` (the default) or ``after_attention`` inside the earlier stage's last block
    (:mod:`mindpipe.traces.layout` owns what a stage then holds); ``None`` means every boundary
    falls between blocks. ``subnet_schedule`` and ``subnet_window`` are the fourth dimension,
    supernet parallelism (NASPipe): how subnets share the pipeline (``csp``, ``sequential``,
    ``sync``, ``async``) and CSP's look-ahead window, the most subnets in flight on a stage. They
    stay ``None`` in a GPT plan (:func:`mindpipe.traces.supernet.check_supernet_plan`).
    ``swap_copy_back`` says per (virtual) stage how its swapped blocks come back for a backward:
    ``prefetch`` (vPipe's: the last one under the action before it, the others one ahead during it)
    or ``lazy`` (each saved tensor as the backward asks for it: less memory, the copy in the open);
    ``None`` prefetches on every stage (:func:`mindpipe.simulator.actions.prefetched_backward`).
    ``stage_clocks_mhz`` locks an SM clock per (virtual) stage, equal on the stages of one rank
    (:mod:`mindpipe.traces.frequency`); ``None`` runs every device at its default clock. The
    executor locks it with NVML on GPUs (a notice on CPU), so it is not a what-if knob.
    ``action_clocks_mhz`` gives instead, per (virtual) stage, the clock of each micro-batch's
    forward and backward (Perseus's per-instruction plan); it is a what-if knob (the executor does
    not switch clocks per action). ``flash_attention`` runs each block's attention core (Q·Kᵀ,
    mask, softmax, dropout, ·V) as one fused kernel that keeps only per-row softmax statistics for
    the backward (FlashAttention-2, Dao 2023; PyTorch's ``scaled_dot_product_attention``) instead
    of Megatron's explicit kernels that save the a·s² scores; the simulator prices and sizes it
    (:mod:`mindpipe.simulator.ops`, :mod:`mindpipe.simulator.memory`) and the executor runs it.
    ``loss_chunks`` > 1 runs the cross-entropy over the logits in that many pieces of tokens
    (torchtune's ``CEWithChunkedOutputLoss``; :func:`mindpipe.traces.torch_gpt.lm_loss`): the loss
    keeps the logits in the compute dtype and upcasts one piece at a time to fp32, in the forward
    and again in the backward, instead of keeping the whole fp32 log-softmax (4·s·b·V/t bytes per
    micro-batch, the largest activation of a big-vocabulary model's last stage). The simulator
    prices the re-run and sizes the saving (:func:`mindpipe.simulator.memory.head_logit_bytes`).
    ``fused_head_loss`` runs the LM head's GEMM inside the loss, over the same ``loss_chunks``
    pieces (torchtitan's ``ChunkedLossWrapper``, Liger-Kernel's ``FusedLinearCrossEntropy``;
    :class:`mindpipe.traces.torch_head_loss.LinearCrossEntropy`): no logits are kept at all, and
    the backward computes each piece's logits again (one more LM-head GEMM) and takes the head's
    weight gradient in the same pass (under a split backward, in I); vocabulary-parallel under TP.
    It needs an untied head (:func:`check_plan`).
    ``blocking_p2p`` makes every pipeline send blocking for its sender, as Megatron-LM's schedules
    are: ``p2p_communication._communicate`` waits on its batched isend/irecv requests and then
    synchronizes the device (``batch_p2p_sync``), so a rank starts its next action only once its
    activation or gradient has landed on the neighbouring stage, and each transfer sits on the
    critical path of every micro-batch. Megatron-core's interleaved schedule with
    ``overlap_p2p_comm`` (NeMo's recipes) and torch.distributed.pipelining's runtime (the executor)
    leave sends in flight; it is a what-if knob (:data:`~mindpipe.traces.what_if.WHAT_IF_KEYS`), set by the validation of
    Megatron's published runs (:mod:`mindpipe.simulator.perf.vtrain`).
    ``fused_elementwise`` prices a Llama block's norms, rotary embedding and SwiGLU as one fused
    kernel each (Transformer Engine) instead of the executor's eager kernels
    (:func:`mindpipe.simulator.ops.rms_norm_ops`); a what-if knob, set by NeMo's validation.
    ``dp_impl`` says whose data parallelism runs (:data:`DP_IMPLS`). ``fsdp2``, the executor's:
    ``replicate`` for ZeRO-0 and ``fully_shard`` otherwise, which copies each gathered parameter out
    of its all-gather buffer and each gradient into the reduction's flat buffer on the compute stream
    (:func:`mindpipe.traces.layout.copies_dp_buffers`), and gathers a sharded stage's weights before
    its first forward, module by module, each under the compute before it
    (:func:`mindpipe.traces.layout.gathers_before_forward`). ``megatron``, Megatron-LM's DDP and
    distributed optimizer: every gradient a view of one contiguous buffer reduced in place, and
    ZeRO-1/2's updated shards all-gathered straight into the parameters' buffer after the optimizer
    step (under the next forward with ``overlap_param_gather``, which needs it); a what-if knob, set
    by the validations of Megatron's and NeMo's published runs.
    ``cp`` is context parallelism (Megatron-core ``--context-parallel-size``): each sequence is
    split over ``cp`` ranks, which hold the same weights; every layer but the attention core works
    on their s/cp tokens, and the causal core of each rank attends its query chunks (two of 2·cp,
    balanced: chunk i and 2·cp−1−i) over every key; gradients are reduced, and a distributed
    optimizer sharded, over dp·cp ranks. Ranks are laid out tp-cp-dp-pp (Megatron-core's order:
    the cp ranks of one data-parallel replica are neighbours inside the ``dp`` axis). It needs
    ``flash_attention`` and s divisible by 2·cp. ``cp_comm_type`` says how K and V reach every
    rank (:data:`CP_COMM_TYPES`; the executor runs both, :mod:`mindpipe.traces.torch_context_parallel`):
    ``allgather`` (Llama 3's context parallelism): K and V all-gathered before one attention
    kernel per query chunk under the causal mask of the tokens' global positions, gathered again
    in the backward, which re-runs those kernels' forward and reduce-scatters the K/V gradients,
    nothing overlapped; or ``p2p``, Transformer Engine's ring (``AttnFuncWithCPAndKVP2P``,
    Megatron-core's default, NeMo's recipes): K and V pass round the ring of cp ranks step by
    step under the attention kernels, which skip the causally masked chunks, their gradients
    likewise in the backward. The simulator prices each
    (:func:`mindpipe.simulator.ops.block_ops`, :func:`mindpipe.simulator.costs.cp_collectives`).
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batch_size: int = 1
    global_batch_size: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False
    zero_stage: int = 0
    precision: str = "bf16"
    comm_priority: str = "fair"
    overlap_grad_reduce: bool = False
    tp_comm_overlap: bool = False
    overlap_param_gather: bool = False
    flash_attention: bool = False
    loss_chunks: int = 1
    fused_head_loss: bool = False
    blocking_p2p: bool = False
    fused_elementwise: bool = False
    dp_impl: str = "fsdp2"
    cp: int = 1
    cp_comm_type: str = CP_COMM_DEFAULT
    rank_order: str = "tp-dp-pp"
    partition: list[int] | None = None
    layer_memory_policy: list[str] | None = None
    stage_cuts: list[str] | None = None
    swap_copy_back: list[str] | None = None
    subnet_schedule: str | None = None
    subnet_window: int | None = None
    stage_clocks_mhz: list[int] | None = None
    action_clocks_mhz: list[list[list[int]]] | None = None
    made_for: MadeFor | None = None
    format_version: int = PLAN_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self.format_version, PLAN_FORMAT_VERSION, "plans")
        for key in PLAN_SCALAR_KEYS:
            check_plan_key(key, getattr(self, key))
        within_limit("dp", self.world_size, "devices", "dp×tp×pp" if self.cp == 1 else "dp×tp×pp×cp")
        self._check_combinations()
        within_limit("pp", self.num_stages, "pipeline_stages", "pp×virtual_stages")
        # m >= 1 here: global_batch_size is a positive multiple of micro_batch_size×dp.
        within_limit("global_batch_size", self.num_microbatches, "micro_batches", "m")
        within_limit("global_batch_size", self.num_microbatches * self.num_stages, "microbatch_stages",
                     "m×pp×virtual_stages")
        self._check_lists()

    def _check_combinations(self) -> None:
        """The rules between keys: batch against micro-batch and dp, schedule against virtual stages,
        and the keys that need another (Megatron-LM's rules where it has them)."""
        per_step = self.micro_batch_size * self.dp
        if self.global_batch_size % per_step:
            unset = " (global_batch_size defaults to 1: give it)" if self.global_batch_size == 1 else ""
            raise ContractError("", "global_batch_size", f"global_batch_size={self.global_batch_size} is not a "
                                f"multiple of micro_batch_size×dp={per_step}{unset}")
        if (rule := virtual_stages_rule(self.schedule, self.virtual_stages)) is not None:
            raise ContractError("", "virtual_stages", rule)
        if self.sequence_parallel and self.tp == 1:
            raise ContractError("", "sequence_parallel", "sequence_parallel=true needs tp > 1")
        if self.tp_comm_overlap and not self.sequence_parallel:
            # Megatron-LM megatron/training/arguments.py: "Tensor parallel communication/GEMM overlap
            # can happen only when sequence parallelism is enabled" (the overlapped collectives are
            # sequence parallelism's all-gather and reduce-scatter).
            raise ContractError("", "tp_comm_overlap", "tp_comm_overlap=true needs sequence_parallel=true (and tp > 1)")
        if self.overlap_param_gather and self.dp_impl != "megatron":
            # FSDP2 has no all-gather after the step: it gathers before the forward, under it already.
            raise ContractError("", "overlap_param_gather", "overlap_param_gather=true needs dp_impl=megatron "
                                "(the distributed optimizer's all-gather after the step; FSDP2 gathers under "
                                "the forward)")
        if self.overlap_param_gather and self.zero_stage not in (1, 2):
            # Megatron-LM arguments.py: --overlap-param-gather "only supported with distributed
            # optimizer"; ZeRO-3 gathers before each stage's forward already (zero_stage 3). Megatron
            # also asks for --overlap-grad-reduce; the two are separate mechanisms here.
            raise ContractError("", "overlap_param_gather", f"overlap_param_gather=true needs zero_stage 1 or 2 "
                                f"(the distributed optimizer's all-gather), got {self.zero_stage}")
        if self.cp > 1 and not self.flash_attention:
            # Megatron-core: context parallelism runs in Transformer Engine's DotProductAttention only.
            raise ContractError("", "cp", f"cp={self.cp} needs flash_attention=true (context parallelism runs in "
                                "the fused attention kernel)")
        if self.cp == 1 and self.cp_comm_type != CP_COMM_DEFAULT:
            # Megatron-core reads --cp-comm-type only under context parallelism: with one rank per
            # sequence no K/V is exchanged, so another value would label a plan with what it does not do.
            # The default stays legal at cp=1: every written plan holds it (schema.to_dict writes each key).
            raise ContractError("", "cp_comm_type", f"cp_comm_type={self.cp_comm_type!r} needs cp > 1 (with cp=1 "
                                f"no rank exchanges K and V; leave cp_comm_type out or at {CP_COMM_DEFAULT!r})")

    def _check_lists(self) -> None:
        """The list keys: their types, lengths (per stage, per boundary) and entries."""
        for key in ("partition", "layer_memory_policy", "stage_cuts", "swap_copy_back"):
            if getattr(self, key) is not None and not isinstance(getattr(self, key), list):
                raise ContractError("", key, f"{key}={shown(getattr(self, key))} must be a list")
        if self.partition is not None:
            if len(self.partition) != self.num_stages:
                raise ContractError("", "partition", f"partition has {plural(len(self.partition), 'entry', 'entries')}, expected "
                                    f"pp×virtual_stages={self.num_stages}")
            for i, n in enumerate(self.partition):
                integer(f"partition[{i}]", n, 1, "num_layers")
        if self.layer_memory_policy is not None:
            for i, p in enumerate(self.layer_memory_policy):
                one_of(f"layer_memory_policy[{i}]", p, LAYER_MEMORY_POLICIES)
            if self.recompute != "none":  # the per-block policy is what runs (traces/layout.block_policies)
                raise ContractError("", "recompute", f"recompute={self.recompute!r} beside layer_memory_policy, whose "
                                    "per-block policies replace it: give the level in the list, or leave recompute out")
        if self.stage_cuts is not None:
            if len(self.stage_cuts) != self.num_stages - 1:
                raise ContractError("", "stage_cuts", f"stage_cuts has {plural(len(self.stage_cuts), 'entry', 'entries')}, expected one "
                                    f"per stage boundary pp×virtual_stages−1={self.num_stages - 1}")
            for i, c in enumerate(self.stage_cuts):
                one_of(f"stage_cuts[{i}]", c, STAGE_CUTS)
        if self.swap_copy_back is not None:
            if len(self.swap_copy_back) != self.num_stages:
                raise ContractError("", "swap_copy_back", f"swap_copy_back has {plural(len(self.swap_copy_back), 'entry', 'entries')}, "
                                    f"expected one per stage pp×virtual_stages={self.num_stages}")
            for i, c in enumerate(self.swap_copy_back):
                one_of(f"swap_copy_back[{i}]", c, SWAP_COPY_BACK)
        if self.stage_clocks_mhz is not None:
            # Layout imports this module; the stage-to-rank rule lives there.
            from mindpipe.traces.frequency import check_stage_clocks_shape
            from mindpipe.traces.layout import stage_to_rank

            check_stage_clocks_shape(self.stage_clocks_mhz, stage_to_rank(self))
        if self.action_clocks_mhz is not None:
            from mindpipe.traces.frequency import check_action_clocks_shape

            check_action_clocks_shape(self.action_clocks_mhz, self.num_stages, self.num_microbatches,
                                      self.stage_clocks_mhz)

    @property
    def cuts_inside_blocks(self) -> bool:
        """True when some stage boundary falls inside a block (``stage_cuts``)."""
        return self.stage_cuts is not None and any(c != "between_blocks" for c in self.stage_cuts)

    def as_executed(self) -> Plan:
        """The plan as the executor runs it: every what-if knob at the executor's value."""
        return dataclasses.replace(self, **WHAT_IF_KEYS)

    @property
    def num_stages(self) -> int:
        """Virtual pipeline stages: pp × virtual_stages."""
        return self.pp * self.virtual_stages

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per iteration per pipeline: global / (micro × dp)."""
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def world_size(self) -> int:
        """Devices the plan needs: dp·tp·pp·cp."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def mesh_text(self) -> str:
        """The mesh as messages write it: ``dp×tp×pp=2×4×8``, or ``dp×tp×pp×cp=1×2×8×4`` with cp."""
        if self.cp == 1:
            return f"dp×tp×pp={self.dp}×{self.tp}×{self.pp}"
        return f"dp×tp×pp×cp={self.dp}×{self.tp}×{self.pp}×{self.cp}"

    def rank_seq_len(self, seq_len: int) -> int:
        """Tokens of a ``seq_len``-token sequence one rank holds: seq_len/cp under context parallelism."""
        return seq_len // self.cp

    @property
    def grad_replicas(self) -> int:
        """Ranks that hold the same weights and reduce their gradients together: dp·cp."""
        return self.dp * self.cp


def even_partition(num_layers: int, num_stages: int) -> list[int]:
    """Equal layer counts per stage; the remainder goes to the first stages (torch's default split)."""
    base, extra = divmod(num_layers, num_stages)
    return [base + (1 if i < extra else 0) for i in range(num_stages)]


def check_stage_count(num_stages: int, num_units: int, unit: str = "block") -> None:
    """Raise unless ``num_stages`` stages can each hold at least one of ``num_units`` units (blocks,
    or a supernet's choice layers). The one owner of the partitioners' rule.

    Raises:
        ContractError: source ``partition``, key ``pp``.
    """
    if not 1 <= num_stages <= num_units:
        raise ContractError("partition", "pp", f"{num_stages} stages cannot each hold a {unit} of {num_units}")


def check_plan(plan: Plan, model: Model, cluster: Cluster | None = None, source: str = "plan") -> None:
    """Check the rules that tie a plan to a model and a cluster.

    Raises:
        ContractError: naming ``source`` and the broken rule, e.g.
            ``plan.json: tp=3 does not divide num_heads=32``.
    """

    def fail(key: str, rule: str) -> NoReturn:
        raise ContractError(source, key, rule)

    for key in SUPERNET_PLAN_KEYS:
        if getattr(plan, key) is not None:
            fail(key, f"{key} applies to supernet models only (model kind is {model.kind!r})")
    _check_sharding(plan, model, fail)
    _check_layers(plan, model, fail)
    if cluster is not None:
        _check_cluster(plan, cluster, source, fail)


def _check_sharding(plan: Plan, model: Model, fail: Callable[[str, str], NoReturn]) -> None:
    """:func:`check_plan`'s rules for splitting the model's heads, widths, tokens and loss."""
    if model.num_heads % plan.tp:
        fail("tp", f"tp={plan.tp} does not divide num_heads={model.num_heads}")
    if model.kv_heads % plan.tp:
        # Megatron replicates K/V heads when tp exceeds them; our executor shards them, so refuse.
        fail("tp", f"tp={plan.tp} does not divide num_kv_heads={model.kv_heads}")
    if model.ffn % plan.tp:
        fail("tp", f"tp={plan.tp} does not divide ffn_hidden_size={model.ffn}")
    if plan.fused_head_loss and model.tie_embeddings:
        # The head's weight would be the token table, gathered by the data-parallel wrapper of the
        # embedding and of the fused head alike.
        fail("fused_head_loss", "fused_head_loss=true needs an untied LM head (tie_embeddings=false)")
    if plan.sequence_parallel and model.seq_len % plan.tp:
        fail("sequence_parallel", f"tp={plan.tp} does not divide seq_len={model.seq_len} (sequence parallelism)")
    if plan.cp > 1 and model.seq_len % (2 * plan.cp):
        fail("cp", f"2×cp={2 * plan.cp} does not divide seq_len={model.seq_len} (context parallelism's balanced chunks)")
    if plan.cp > 1 and plan.sequence_parallel and (model.seq_len // plan.cp) % plan.tp:
        fail("sequence_parallel", f"tp={plan.tp} does not divide a context-parallel rank's "
                                  f"seq_len/cp={model.seq_len // plan.cp} tokens (sequence parallelism)")
    if plan.loss_chunks > plan.micro_batch_size * model.seq_len:
        fail("loss_chunks", f"loss_chunks={plan.loss_chunks} exceeds the micro-batch's tokens "
                            f"micro_batch_size×seq_len={plan.micro_batch_size * model.seq_len}")


def _check_layers(plan: Plan, model: Model, fail: Callable[[str, str], NoReturn]) -> None:
    """:func:`check_plan`'s rules for the stages, the per-block policies and the micro-batches."""
    if plan.num_stages > model.num_layers:
        fail("pp", f"pp×virtual_stages={plan.num_stages} exceeds num_layers={model.num_layers}")
    if plan.partition is not None and sum(plan.partition) != model.num_layers:
        fail("partition", f"partition sums to {plural(sum(plan.partition), 'layer')}, model has num_layers={model.num_layers}")
    if plan.layer_memory_policy is not None and len(plan.layer_memory_policy) != model.num_layers:
        fail("layer_memory_policy", f"layer_memory_policy has {plural(len(plan.layer_memory_policy), 'entry', 'entries')}, "
                                    f"model has num_layers={model.num_layers}")
    from mindpipe.traces.layout import cut_block_refusal, nongemm_refusal  # local: layout imports this module

    if plan.layer_memory_policy is not None and "nongemm" in plan.layer_memory_policy:
        refusal = nongemm_refusal(plan)
        if refusal:
            fail("layer_memory_policy", refusal)
    if plan.cuts_inside_blocks and (rule := cut_block_refusal(plan, model)) is not None:
        fail("stage_cuts", rule)
    m = plan.num_microbatches  # global_batch_size / (micro_batch_size·dp): not a plan key of its own
    if plan.schedule != "gpipe" and plan.pp > 1 and m < plan.pp:
        fail("global_batch_size", f"schedule {plan.schedule!r} needs micro-batches m={m} >= pp={plan.pp}")
    if (rule := microbatch_rule(plan.schedule, plan.pp, m) or runtime_microbatch_rule(plan.schedule, plan.pp, m)):
        fail("global_batch_size", rule)


def _check_cluster(plan: Plan, cluster: Cluster, source: str, fail: Callable[[str, str], NoReturn]) -> None:
    """:func:`check_plan`'s rules tying the plan to the cluster's devices."""
    if plan.world_size != cluster.world_size:
        fail(
            "dp",
            f"{plan.mesh_text}={plan.world_size} does not equal the cluster's "
            f"{cluster.num_nodes}×{cluster.gpus_per_node}={cluster.world_size} devices",
        )
    check_precision(plan.precision, cluster.gpu, source)
    if plan.stage_clocks_mhz is not None:
        from mindpipe.traces.catalog import get_device
        from mindpipe.traces.frequency import check_stage_clocks

        # CPU hosts have no lockable SM clock: the executor skips the key with a notice.
        if get_device(cluster.gpu).kind == "gpu":
            check_stage_clocks(plan.stage_clocks_mhz, cluster.gpu, source)
    if plan.action_clocks_mhz is not None:
        from mindpipe.traces.frequency import check_action_clocks

        # A what-if knob: only the simulator carries it out, so the device must have clock data.
        check_action_clocks(plan.action_clocks_mhz, cluster.gpu, source)


def stage_layers(plan: Plan, model: Model) -> list[int]:
    """Layers per virtual stage: the plan's partition, or an even split."""
    return list(plan.partition) if plan.partition is not None else even_partition(model.num_layers, plan.num_stages)


__all__ = ["COMM_PRIORITIES", "DP_IMPLS", "PLAN_SCALAR_KEYS", "PRECISIONS", "RECOMPUTE", "SCHEDULES",
           "SEQUENTIAL_EQUIVALENT_SCHEDULES", "STAGE_CUTS", "SUBNET_SCHEDULES",
           "SUPERNET_PLAN_KEYS", "SWAP_COPY_BACK", "Cluster", "MadeFor", "Model", "Plan", "check_plan", "check_plan_key",
           "check_stage_count", "even_partition", "fixed_virtual_stages", "microbatch_rule", "stage_layers",
           "virtual_stages_rule"]

# MadeFor.supernet's type, resolved when a plan is read (schema.from_dict). Imported last, as a module:
# traces/supernet.py imports this module's contracts, so the two may load in either order.
import mindpipe.traces.supernet as _supernet_contract  # noqa: E402
