"""The supernet contract (NASPipe, ASPLOS'22): choice layers × candidate operators, and a subnet sampler.

A supernet is a stack of ``num_layers`` *choice layers*; every layer holds one instance of each
candidate operator (its own weights) and a subnet picks one candidate per layer, written as a
*choice vector* of candidate indices. Each candidate is a pre-norm residual branch
``x + op(LayerNorm(x))`` with its own LayerNorm, as NASPipe's context switch moves "the chosen op's
parameters + LayerNorm" together (BACKGROUND.md §5). Around the stack sit the *shared* parts:
token and position embeddings before it, a final LayerNorm and an untied LM head after it.

**Why the shared parts are frozen by default.** Causal synchronous parallelism (CSP) lets stage s
start subnet b only when no earlier, not yet updated subnet uses the same operator on s. A
parameter that every subnet trains is an operator every subnet uses: the first stage could not
start subnet b+1 before subnet b's backward returned, and the pipeline would run one subnet at a
time. ``train_shared=true`` trains them anyway; the schedules then treat them as one more operator
every subnet chooses (:func:`stage_operators`), which serialises the stages that hold them.

Candidate operators (NASPipe's Evolved-Transformer/HAT-like space, mapped onto three kinds):
``attention`` (causal multi-head self-attention, ``num_heads``), ``ffn`` (two-layer MLP of width
``ffn_hidden_size``) and ``conv`` (causal 1-D convolution over the sequence of ``kernel_size``:
``standard`` h→h, ``separable`` depthwise + pointwise, or ``lightweight`` depthwise with weights
shared by ``conv_heads`` channel groups, Wu et al. ICLR'19).

**Per-layer candidate lists.** ``candidates`` is the supernet's *pool*; by default every layer
chooses among all of it. ``layer_candidates`` narrows that per layer (a list of pool names for
each choice layer), as spaces whose layers differ do — e.g. convolutions only in the lower layers,
or an encoder and a decoder half with their own operator sets. A choice vector still holds *pool*
indices (so the operator keys of :func:`stage_operators`, the trace records and the executor's
module names mean the same whatever the lists); layer ``l`` may choose only the indices
:meth:`Supernet.layer_choices` gives, each stage holds only those candidates' weights, and the
uniform sampler draws among them, so two subnets share layer ``l``'s operator with chance
``1/K_l`` and a stage's conflict probability is ``1 − Π_l (1 − 1/K_l)``
(:func:`stage_conflict_probability`).

The sampler draws subnet ``i`` from its own generator seeded with ``(seed, i)``, so the stream is
the same whatever its length, and a resumed or data-parallel run can draw any subnet directly.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from mindpipe.traces.catalog import check_precision
from mindpipe.traces.config import Cluster, Plan, check_stage_count, even_partition, one_of
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import integer, limit, shown
from mindpipe.traces.schema import check_format_version
from mindpipe.traces.units import plural
from mindpipe.traces.what_if import what_if_used

SUPERNET_FORMAT_VERSION = 1
CANDIDATE_OPS = ("attention", "ffn", "conv")
CONV_TYPES = ("standard", "separable", "lightweight")
SAMPLERS = ("uniform",)
MAX_CANDIDATES = 1024
"""Candidate operators per choice layer (NASPipe's largest space has 48)."""

Choices = tuple[int, ...]
"""A subnet: the index of the chosen candidate in every choice layer."""


@dataclass
class Candidate:
    """One candidate operator of a choice layer.

    Attributes:
        name: Unique label within the supernet (``attn8``, ``conv_sep7``).
        op: ``attention``, ``ffn`` or ``conv``.
        num_heads: Attention heads (attention only; must divide the supernet's hidden size).
        ffn_hidden_size: MLP width (ffn only).
        kernel_size: Convolution width over the sequence (conv only).
        conv_type: ``standard``, ``separable`` (default) or ``lightweight`` (conv only).
        conv_heads: Channel groups sharing one kernel (lightweight conv only; divides the hidden size).
    """

    name: str
    op: str
    num_heads: int | None = None
    ffn_hidden_size: int | None = None
    kernel_size: int | None = None
    conv_type: str | None = None
    conv_heads: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or len(self.name) > 64:
            raise ContractError("", "name", f"name={shown(self.name)} must be a string of 1 to 64 characters")
        one_of("op", self.op, CANDIDATE_OPS)
        needs = {"attention": ("num_heads",), "ffn": ("ffn_hidden_size",), "conv": ("kernel_size",)}[self.op]
        optional = ("conv_type", "conv_heads") if self.op == "conv" else ()
        for key in ("num_heads", "ffn_hidden_size", "kernel_size", "conv_type", "conv_heads"):
            value = getattr(self, key)
            if key in needs and value is None:
                raise ContractError("", key, f"a {self.op} candidate needs {key}")
            if key not in needs and key not in optional and value is not None:
                raise ContractError("", key, f"{key} does not apply to a {self.op} candidate")
        for key, limit_key in (("num_heads", "num_heads"), ("ffn_hidden_size", "ffn_hidden_size"),
                               ("kernel_size", "seq_len"), ("conv_heads", "num_heads")):
            if getattr(self, key) is not None:
                integer(key, getattr(self, key), 1, limit_key)
        if self.op == "conv":
            one_of("conv_type", self.conv_kind, CONV_TYPES)
            if (self.conv_kind == "lightweight") != (self.conv_heads is not None):
                raise ContractError("", "conv_heads", "conv_heads is needed by, and only by, a lightweight conv")

    def describe(self) -> str:
        """The operator and its settings (``ffn (ffn_hidden_size=128)``)."""
        keys = ("num_heads", "ffn_hidden_size", "kernel_size", "conv_type", "conv_heads")
        return f"{self.op} ({', '.join(f'{k}={getattr(self, k)}' for k in keys if getattr(self, k) is not None)})"

    @property
    def conv_kind(self) -> str:
        """The convolution type (``separable`` when not given)."""
        return self.conv_type if self.conv_type is not None else "separable"

    def param_count(self, hidden: int) -> int:
        """Weights of this candidate in one layer, its own pre-norm LayerNorm (2h) included."""
        h, norm = hidden, 2 * hidden
        if self.op == "attention":
            return norm + 4 * h * h + 4 * h  # QKV and output projections with biases
        if self.op == "ffn":
            f = self.ffn_hidden_size or 0
            return norm + 2 * h * f + f + h
        k = self.kernel_size or 0
        if self.conv_kind == "standard":
            return norm + k * h * h + h
        if self.conv_kind == "separable":
            return norm + k * h + h + h * h + h  # depthwise (with bias) then pointwise
        return norm + (self.conv_heads or 0) * k  # lightweight: one kernel per channel group, no bias


@dataclass
class Sampler:
    """How subnets are drawn: ``uniform`` picks every layer's candidate uniformly at random."""

    kind: str = "uniform"
    seed: int = 0

    def __post_init__(self) -> None:
        one_of("kind", self.kind, SAMPLERS)
        integer("seed", self.seed, 0, "seed")


@dataclass
class Supernet:
    """A weight-sharing supernet: ``num_layers`` choice layers over one pool of candidates.

    Attributes:
        kind: Always ``"supernet"``.
        num_layers: Choice layers L.
        hidden_size: Model width h.
        seq_len: Tokens per sequence s.
        vocab_size: Vocabulary V (embedding and LM head).
        candidates: The pool of K candidate operators (every layer chooses from all of them
            unless ``layer_candidates`` says otherwise).
        layer_candidates: Optional, one list of pool names per choice layer: the candidates that
            layer holds and may choose (module docstring). Every pool candidate must be in at
            least one list.
        sampler: How subnets are drawn (uniform, seeded).
        train_shared: Train the embeddings, final norm and LM head too (serialises the stages that
            hold them under CSP; see the module docstring).
        name: Optional label (built-ins carry their name).
    """

    kind: str
    num_layers: int
    hidden_size: int
    seq_len: int
    vocab_size: int
    candidates: list[Candidate]
    layer_candidates: list[list[str]] | None = None
    sampler: Sampler = field(default_factory=Sampler)
    train_shared: bool = False
    name: str | None = None
    format_version: int = SUPERNET_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self.format_version, SUPERNET_FORMAT_VERSION, "supernets")
        one_of("kind", self.kind, ("supernet",))
        for key in ("num_layers", "hidden_size", "seq_len", "vocab_size"):
            integer(key, getattr(self, key), 1, key)
        if not isinstance(self.train_shared, bool):
            raise ContractError("", "train_shared", f"train_shared={shown(self.train_shared)} must be true or false")
        if not isinstance(self.candidates, list) or not self.candidates:
            raise ContractError("", "candidates", "candidates must be a non-empty list of candidate operators")
        if len(self.candidates) > MAX_CANDIDATES:
            raise ContractError("", "candidates", f"{len(self.candidates)} candidates exceed the limit of "
                                f"{MAX_CANDIDATES} per choice layer")
        seen: set[str] = set()
        for i, c in enumerate(self.candidates):
            key = f"candidates[{i}]"
            if c.name in seen:
                raise ContractError("", f"{key}.name", f"candidate name {c.name!r} is used twice")
            seen.add(c.name)
            for width_key in ("num_heads", "conv_heads"):
                width = getattr(c, width_key)
                if width is not None and self.hidden_size % width:
                    raise ContractError("", f"{key}.{width_key}",
                                        f"{width_key}={width} does not divide hidden_size={self.hidden_size}")
            if c.kernel_size is not None and c.kernel_size > self.seq_len:
                raise ContractError("", f"{key}.kernel_size",
                                    f"kernel_size={c.kernel_size} exceeds seq_len={self.seq_len}")
        if self.layer_candidates is not None:
            self._check_layer_candidates(self.layer_candidates)

    def _check_layer_candidates(self, lists: object) -> None:
        if not isinstance(lists, list) or len(lists) != self.num_layers:
            got = f"{len(lists)} lists" if isinstance(lists, list) else shown(lists)
            raise ContractError("", "layer_candidates", f"layer_candidates must be one list of candidate names per "
                                f"choice layer ({self.num_layers}), got {got}")
        pool = {c.name for c in self.candidates}
        used: set[str] = set()
        for layer, names in enumerate(lists):
            key = f"layer_candidates[{layer}]"
            if not isinstance(names, list) or not names:
                raise ContractError("", key, f"{key}={shown(names)} must be a non-empty list of candidate names")
            for name in names:
                if not isinstance(name, str) or name not in pool:
                    raise ContractError("", key, f"{shown(name)} is not a candidate name (the pool: "
                                        f"{', '.join(c.name for c in self.candidates)})")
            if len(set(names)) != len(names):
                twice = next(n for n in names if names.count(n) > 1)
                raise ContractError("", key, f"candidate {twice!r} is listed twice")
            used.update(names)
        unused = [c.name for c in self.candidates if c.name not in used]
        if unused:
            raise ContractError("", "layer_candidates", f"candidate {unused[0]!r} is in no layer's list: drop it from "
                                "candidates or list it")

    @cached_property
    def _layer_choices(self) -> tuple[tuple[int, ...], ...]:
        every = tuple(range(len(self.candidates)))
        if self.layer_candidates is None:
            return (every,) * self.num_layers
        index = {c.name: k for k, c in enumerate(self.candidates)}
        return tuple(tuple(index[name] for name in names) for names in self.layer_candidates)

    def layer_choices(self, layer: int) -> tuple[int, ...]:
        """The pool indices choice layer ``layer`` may choose, in its list's order (the sampler's)."""
        return self._layer_choices[layer]

    @property
    def uniform_layers(self) -> bool:
        """Whether every layer chooses among the whole pool (no ``layer_candidates``, or lists that all hold it)."""
        return all(len(c) == len(self.candidates) for c in self._layer_choices)

    @property
    def num_choices(self) -> int:
        """Candidates in the pool, K (per layer, :meth:`layer_choices`)."""
        return len(self.candidates)

    @property
    def label(self) -> str:
        """The name if any, else a compact shape description."""
        return self.name or f"supernet-L{self.num_layers}-K{self.num_choices}-h{self.hidden_size}"

    def shared_param_count(self) -> int:
        """Embeddings (token + position), final LayerNorm and the untied LM head."""
        h = self.hidden_size
        return self.vocab_size * h + self.seq_len * h + 2 * h + self.vocab_size * h

    def layer_param_count(self, layer: int) -> int:
        """Weights of choice layer ``layer``: every candidate it holds."""
        return sum(self.candidates[k].param_count(self.hidden_size) for k in self.layer_choices(layer))

    def param_count(self) -> int:
        """The whole supernet's weights."""
        return self.shared_param_count() + sum(self.layer_param_count(layer) for layer in range(self.num_layers))

    def subnet_param_count(self, choices: Choices) -> int:
        """Weights one subnet uses (its chosen candidates and the shared parts)."""
        check_choices(self, choices)
        h = self.hidden_size
        return self.shared_param_count() + sum(self.candidates[k].param_count(h) for k in choices)

    def describe(self) -> str:
        """The label and the shape."""
        counts = [len(c) for c in self._layer_choices]
        per_layer = "" if self.uniform_layers else f", {min(counts)}–{max(counts)} per layer"
        return (f"{self.label} (num_layers={self.num_layers}, candidates={self.num_choices}{per_layer}, "
                f"hidden_size={self.hidden_size}, seq_len={self.seq_len}, vocab_size={self.vocab_size})")


def check_choices(supernet: Supernet, choices: Sequence[int], source: str = "subnet") -> None:
    """Raise unless ``choices`` is a valid choice vector of ``supernet``."""
    if len(choices) != supernet.num_layers:
        raise ContractError(source, "choices", f"has {plural(len(choices), 'entry', 'entries')}, supernet has num_layers="
                            f"{supernet.num_layers}")
    for i, k in enumerate(choices):
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 0 <= k < supernet.num_choices:
            raise ContractError(source, f"choices[{i}]", f"choices[{i}]={shown(k)} is not a candidate index "
                                f"0..{supernet.num_choices - 1}")
        if int(k) not in supernet.layer_choices(i):
            allowed = supernet.layer_choices(i)
            raise ContractError(source, f"choices[{i}]", f"choices[{i}]={k} ({supernet.candidates[k].name}) is not in "
                                f"layer {i}'s list (layer_candidates[{i}]: pool indices "
                                f"{', '.join(str(j) for j in sorted(allowed))})")


def sample_subnet(supernet: Supernet, index: int) -> Choices:
    """Subnet ``index`` of the supernet's stream (the same in every run with this sampler seed)."""
    integer("subnet", index, 0, "train_steps")
    rng = np.random.default_rng([supernet.sampler.seed, index])
    if supernet.layer_candidates is None:
        return tuple(int(k) for k in rng.integers(0, supernet.num_choices, size=supernet.num_layers))
    lists = [supernet.layer_choices(layer) for layer in range(supernet.num_layers)]
    picks = rng.integers(0, np.array([len(c) for c in lists]))
    return tuple(c[int(j)] for c, j in zip(lists, picks, strict=True))


def sample_subnets(supernet: Supernet, count: int, start: int = 0) -> list[Choices]:
    """Subnets ``start .. start+count-1`` of the stream."""
    integer("count", count, 0, "train_steps")
    return [sample_subnet(supernet, start + i) for i in range(count)]


SHARED_OPERATOR = (-1, 0)
"""The (layer, candidate) key :func:`stage_operators` uses for trained shared parameters."""


def stage_operators(supernet: Supernet, choices: Choices, first_layer: int, num_layers: int,
                    holds_shared: bool) -> frozenset[tuple[int, int]]:
    """The operators a subnet uses on a stage: ``(layer, candidate)`` for each of its choice layers.

    This is the one owner of what two subnets *share* on a stage: CSP's conflict rule, the simulator's
    conflict statistics and the executor's context switch all ask it. Trained shared parameters
    (``train_shared``) count as :data:`SHARED_OPERATOR` on a stage that holds them.

    Args:
        supernet: The supernet.
        choices: The subnet's choice vector.
        first_layer: The stage's first choice layer.
        num_layers: Choice layers on the stage (may be 0 for a stage holding only shared parts).
        holds_shared: Whether the stage holds the embeddings or the LM head.
    """
    ops = {(layer, int(choices[layer])) for layer in range(first_layer, first_layer + num_layers)}
    if holds_shared and supernet.train_shared:
        ops.add(SHARED_OPERATOR)
    return frozenset(ops)


DEFAULT_WINDOW_PER_STAGE = 2
"""CSP's default look-ahead window is 2 × pp subnets: room to skip a conflicting subnet past 1F1B's pp in flight."""
DEFAULT_SUBNETS = 1000
"""Subnets ``mindpipe simulate`` and :meth:`~mindpipe.simulator.subnet_sim.SupernetSimulator.run` replay by default."""


def default_subnets(plan: Plan) -> int:
    """:data:`DEFAULT_SUBNETS`, rounded up to whole batches of a ``sync`` plan (:func:`subnet_batch`)."""
    batch = subnet_batch(plan)
    return -(-DEFAULT_SUBNETS // batch) * batch


def max_subnets(supernet: Supernet) -> int:
    """Most subnets one simulation of ``supernet`` draws: the ``subnet_choices`` limit over num_layers.

    The simulator's work and memory grow with the choices it draws, subnets × num_layers, and
    :meth:`~mindpipe.simulator.subnet_sim.SupernetSimulator.run` refuses more than ``subnet_choices``.
    """
    return int(limit("subnet_choices")) // supernet.num_layers


def check_subnet_count(supernet: Supernet, num_subnets: int, source: str = "--subnets", default: bool = False) -> None:
    """Raise unless ``num_subnets`` is a whole number of subnets one simulation of ``supernet`` may draw.

    The tuner asks this before its sweep, so that a count past the limit is refused once, naming the
    limit, instead of being recorded as an invalid plan at every point (:func:`max_subnets`).

    Args:
        supernet: The supernet simulated.
        num_subnets: Subnets per simulation.
        source: The argument that set the count, named in the error (``--subnets``, or the
            Python keyword ``subnets``).
        default: The count is the caller's default, not the user's (the error then says so).

    Raises:
        ContractError: ``--subnets=70000 exceeds the limit of 65,536 subnets for supernet-mini: ...``.
    """
    integer(source, num_subnets, 1, "train_steps")
    most = max_subnets(supernet)
    if num_subnets > most:
        given = f"{source}={num_subnets} (the default)" if default else f"{source}={num_subnets}"
        raise ContractError("", source, f"{given} exceeds the limit of {most:,} subnets for {supernet.label}: one "
                            f"simulation draws at most {int(limit('subnet_choices')):,} choices (subnets × num_layers, "
                            f"here {num_subnets} × {supernet.num_layers})" + (f"; give {source} of at most {most:,}"
                                                                             if default else ""))


def subnet_schedule(plan: Plan) -> str:
    """The plan's supernet schedule (``csp`` when not set)."""
    return plan.subnet_schedule if plan.subnet_schedule is not None else "csp"


def subnet_window(plan: Plan) -> int:
    """The plan's CSP look-ahead window (2 × pp when not set)."""
    return plan.subnet_window if plan.subnet_window is not None else DEFAULT_WINDOW_PER_STAGE * plan.pp


def subnet_batch(plan: Plan) -> int:
    """Subnets per synchronous batch: the window under ``sync`` (its weights update once per batch), else 1."""
    return subnet_window(plan) if subnet_schedule(plan) == "sync" else 1


def supernet_stage_layers(plan: Plan, supernet: Supernet) -> list[int]:
    """Choice layers per pipeline stage: the plan's partition, or an even split."""
    return list(plan.partition) if plan.partition is not None else even_partition(supernet.num_layers, plan.pp)


def water_fill(num_layers: int, num_stages: int, per_layer: float, first: float, last: float) -> list[int]:
    """Layers per stage: one each, then each next layer to the least-loaded stage (ties: the later one).

    The ``balanced`` supernet partition's rule (:mod:`mindpipe.tuner.subnet_partition` prices the
    loads; online repartition, :mod:`mindpipe.executor.supernet_repartition`, measures them).

    Raises:
        ContractError: more stages than layers.
    """
    check_stage_count(num_stages, num_layers, "choice layer")
    counts = [1] * num_stages
    extra = [0.0] * num_stages
    extra[0] += first
    extra[-1] += last
    heap = [(extra[s] + per_layer, -s) for s in range(num_stages)]
    heapq.heapify(heap)
    for _ in range(num_layers - num_stages):
        _, neg = heapq.heappop(heap)
        counts[-neg] += 1
        heapq.heappush(heap, (extra[-neg] + counts[-neg] * per_layer, neg))
    return counts


def subnet_stage_operators(supernet: Supernet, plan: Plan, choices: Choices) -> list[frozenset[tuple[int, int]]]:
    """Per pipeline stage, the operators subnet ``choices`` uses there (:func:`stage_operators`).

    The first stage also holds the embeddings and the last the final norm and LM head.
    """
    out, first = [], 0
    layers = supernet_stage_layers(plan, supernet)
    for s, n in enumerate(layers):
        out.append(stage_operators(supernet, choices, first, n, s in (0, len(layers) - 1)))
        first += n
    return out


def check_supernet_plan(plan: Plan, supernet: Supernet, cluster: Cluster | None = None,
                        source: str = "plan") -> None:
    """Check the rules that tie a plan to a supernet (the supernet counterpart of ``check_plan``).

    One subnet trains one micro-batch per data-parallel replica, so ``global_batch_size`` is
    ``micro_batch_size × dp``. Pipeline stages hold whole choice layers (``partition`` counts
    them). Tensor parallelism, virtual stages, per-layer memory policies, intra-block cuts and
    ZeRO are not supported for supernets yet; the pipeline order is ``subnet_schedule``'s.

    Raises:
        ContractError: naming ``source``, the key and the rule.
    """

    def fail(key: str, rule: str) -> None:
        raise ContractError(source, key, rule)

    if plan.tp != 1:
        fail("tp", f"tp={plan.tp}: tensor parallelism is not supported for supernets (use dp and pp)")
    if plan.virtual_stages != 1:
        fail("virtual_stages", "supernet plans place one stage per pipeline rank (virtual_stages=1)")
    if plan.schedule != "1f1b":
        fail("schedule", f"schedule={plan.schedule!r}: a supernet plan's pipeline order is subnet_schedule's "
             "(csp, sequential, sync, async); leave schedule out")
    for key in ("layer_memory_policy", "stage_cuts", "swap_copy_back"):
        if getattr(plan, key) is not None:
            fail(key, f"{key} is not supported for supernets yet")
    if plan.zero_stage:
        fail("zero_stage", "zero_stage > 0 is not supported for supernets yet")
    if plan.loss_chunks != 1:
        fail("loss_chunks", "loss_chunks > 1 is not supported for supernets yet")
    if plan.fused_head_loss:
        fail("fused_head_loss", "fused_head_loss=true is not supported for supernets yet")
    if what_if_used(plan):
        fail(what_if_used(plan)[0], "what-if knobs are not modelled for supernets")
    if plan.cp > 1:
        fail("cp", f"cp={plan.cp}: context parallelism is not modelled for supernets (their subnets' attention "
             "runs whole sequences)")
    if plan.global_batch_size != plan.micro_batch_size * plan.dp:
        fail("global_batch_size", f"global_batch_size={plan.global_batch_size}: a subnet trains one micro-batch per "
             f"replica, so it must equal micro_batch_size×dp={plan.micro_batch_size * plan.dp}")
    if plan.pp > supernet.num_layers:
        fail("pp", f"pp={plan.pp} exceeds the supernet's num_layers={supernet.num_layers}")
    if plan.partition is not None and sum(plan.partition) != supernet.num_layers:
        fail("partition", f"partition sums to {sum(plan.partition)} layers, supernet has num_layers="
             f"{supernet.num_layers}")
    if cluster is not None and plan.world_size != cluster.world_size:
        fail("dp", f"dp×pp={plan.dp}×{plan.pp}={plan.world_size} does not equal the cluster's "
             f"{cluster.num_nodes}×{cluster.gpus_per_node}={cluster.world_size} devices")
    if cluster is not None:
        check_precision(plan.precision, cluster.gpu, source)


def conflict_probability(num_choices: int, layers_on_stage: int) -> float:
    """Chance that two uniformly drawn subnets share an operator on a stage: 1 − (1 − 1/K)^{L_s}."""
    return 1.0 - (1.0 - 1.0 / num_choices) ** layers_on_stage


def stage_conflict_probability(supernet: Supernet, first_layer: int, num_layers: int,
                               holds_shared: bool = False) -> float:
    """Chance that two uniformly drawn subnets share an operator on choice layers ``[first_layer, +num_layers)``.

    ``1 − Π_l (1 − 1/K_l)`` over the layers' list sizes (module docstring): :func:`conflict_probability`
    when every layer chooses among the whole pool. A stage that ``holds_shared`` parts of a supernet
    that trains them (``train_shared``) conflicts always: every subnet uses :data:`SHARED_OPERATOR`
    there (:func:`stage_operators`).
    """
    if holds_shared and supernet.train_shared:
        return 1.0
    if supernet.uniform_layers:
        return conflict_probability(supernet.num_choices, num_layers)
    miss = 1.0
    for layer in range(first_layer, first_layer + num_layers):
        miss *= 1.0 - 1.0 / len(supernet.layer_choices(layer))
    return 1.0 - miss


__all__ = [
    "CANDIDATE_OPS",
    "CONV_TYPES",
    "DEFAULT_SUBNETS",
    "SHARED_OPERATOR",
    "Candidate",
    "Choices",
    "Sampler",
    "Supernet",
    "check_choices",
    "check_subnet_count",
    "check_supernet_plan",
    "conflict_probability",
    "default_subnets",
    "max_subnets",
    "sample_subnet",
    "sample_subnets",
    "stage_conflict_probability",
    "stage_operators",
    "subnet_batch",
    "subnet_schedule",
    "subnet_stage_operators",
    "subnet_window",
    "supernet_stage_layers",
    "water_fill",
]
