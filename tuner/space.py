"""The search space of 4D plans for a (model, cluster), enumerated and filtered by the plan rules.

The space lists every point (:mod:`mindpipe.tuner.keys`) that the rules' owners accept (issue 6,
point 1): the :class:`~mindpipe.traces.config.Plan` contract and
:func:`~mindpipe.traces.config.check_plan` (dp·tp·pp·cp = devices, tp dividing the heads and the MLP
width, pp·v ≤ layers, global batch a multiple of micro-batch × dp, micro-batches per schedule,
sequence parallelism) and :func:`~mindpipe.simulator.schedules.schedule_rule` (the schedules' own
rules, owned by :func:`~mindpipe.traces.schedule_rules.microbatch_rule` and ``virtual_stages_rule``). The space adds two of its own: tp ≤ devices per node, and the values ``--fix`` pins.
Combinations that break a rule are counted per :class:`~mindpipe.tuner.rules.Rule`, so the output
can say how many were filtered and why.

Dimensions that cannot change the result are not multiplied out (the first allowed value is
kept): the schedule, virtual stages, partitioner (but for the memory-aware ones, which choose
per-block policies) and ``comm_priority`` when there is one pipeline stage, the recompute level
for the memory-aware partitioners (their per-block policy overrides it), the ZeRO stage,
``overlap_grad_reduce`` and ``overlap_param_gather`` when dp·cp = 1 (no gradient replicas),
sequence parallelism when tp = 1, ``tp_comm_overlap`` without sequence parallelism;
``overlap_param_gather`` is only paired with ZeRO 1 and 2 (the Plan's rule). The memory-aware
partitioners plan one stage per rank, so they are left out of interleaved and V schedules.
What-if knobs (:data:`~mindpipe.tuner.keys.WHAT_IF_KEYS`) keep the value the executor runs unless
``what_if`` names them. Keys searched on request (``search``,
:data:`~mindpipe.tuner.keys.SEARCH_ON_REQUEST_KEYS`) keep their default unless named or pinned:
context parallelism (``cp``) splits each mesh's data-parallel devices into dp × cp, and its points
carry FlashAttention (the Plan's cp rule). The attention core is Megatron's explicit kernels (the
Plan's default) unless pinned, but for a Llama-family model on GPUs, where both are searched
(:func:`default_attention`). ``--fix KEY=VALUE``
pins a key (``KEY=A,B`` restricts it to a set); pinned keys are never dropped by the rules above,
only restricted.

A supernet (NASPipe) has its own points — dp × pp, micro-batch, ``subnet_schedule``,
``subnet_window`` and the supernet partitioner — enumerated by :mod:`mindpipe.tuner.subnet_space`.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import InitVar, dataclass, field
from typing import Any

from mindpipe.simulator.schedules import schedule_rule
from mindpipe.traces.catalog import check_precision, fp8_tp_refusal, get_device
from mindpipe.traces.config import (
    COMM_PRIORITIES,
    CP_COMM_TYPES,
    DP_IMPLS,
    RECOMPUTE,
    SCHEDULES,
    Cluster,
    Model,
    check_plan,
    fixed_virtual_stages,
)
from mindpipe.traces.errors import ContractError
from mindpipe.traces.supernet import Supernet
from mindpipe.tuner.keys import (
    CLI_ARG_NAMES,
    LIST_KEYS,
    OPTIONAL_POINT_KEYS,
    PLAN_DEFAULTS,
    POINT_KEYS,
    SEARCH_ON_REQUEST_KEYS,
    SUPERNET_POINT_KEYS,
    WHAT_IF_KEYS,
    ArgNames,
    Point,
    check_fixes_what_if,
    check_partitioners,
    plan_of,
)
from mindpipe.tuner.memsplit import MEMORY_PARTITIONERS
from mindpipe.tuner.rules import Rule, rule_of
from mindpipe.tuner.subnet_space import check_supernet_fixes, supernet_points

DEFAULT_MICRO_BATCHES = (1, 2, 4, 8)
DEFAULT_INTERLEAVE = (2, 4)  # virtual stages tried for interleaved_1f1b (Megatron uses 2-4 chunks)
# Every value of each what-if knob (searched only when the knob is named in ``what_if``).
_WHAT_IF_VALUES: dict[str, tuple[Any, ...]] = {"comm_priority": COMM_PRIORITIES, "overlap_grad_reduce": (False, True),
                                               "tp_comm_overlap": (False, True), "overlap_param_gather": (False, True),
                                               "blocking_p2p": (False, True), "fused_elementwise": (False, True),
                                               "dp_impl": DP_IMPLS}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def default_attention(model: Model, cluster: Cluster) -> list[bool]:
    """The ``flash_attention`` values searched when ``--fix`` does not pin it.

    Megatron's explicit kernels (the Plan's default, what the GPT runs the simulator is checked on
    used), and FlashAttention as well for a Llama-family model on GPUs: every Llama recipe
    (Meta's, NeMo's, torchtitan's) runs a fused attention kernel there, and at its sequence
    lengths the explicit core's a·s² scores set both the time and the memory (llama3-8b on 8 H100,
    40 simulations: 1.57 samples/s best with explicit kernels only, 10.6 with both searched).
    """
    gpu = get_device(cluster.gpu).kind == "gpu"
    return [False, True] if gpu and model.is_llama else [False]


@dataclass(frozen=True)
class _CommKnobs:
    """Values the communication keys of one base point take (:meth:`SearchSpace._comm_knobs`)."""

    zero_stage: list[Any]
    overlap_grad_reduce: list[Any]
    tp_comm_overlap: list[Any]
    overlap_param_gather: list[Any]
    comm_priority: list[Any]
    blocking_p2p: list[Any]
    cp_comm_type: list[Any]


@dataclass
class SearchSpace:
    """Every valid plan point for ``model`` on ``cluster``.

    Attributes:
        model, cluster: What is being planned.
        global_batches: Global batch sizes to try (one value = fixed).
        fixes: Parsed ``--fix`` values (see :func:`mindpipe.tuner.keys.parse_fixes`).
        partitioners: Partitioners to try (a dimension when more than one).
        what_if: What-if knobs to search (:func:`mindpipe.tuner.keys.parse_what_if`); the others
            keep the value the executor runs.
        search: Plan keys searched on request (:func:`mindpipe.tuner.keys.parse_search`: ``cp``).
        batch_given: Whether ``global_batches`` was asked for (else a default; a supernet sweep
            with a pinned micro-batch then leaves the batch free).
        points: The valid points, in a stable enumeration order.
        rejected: Count of rejected combinations per broken rule.
        arg_names: How a refusal names the arguments (not kept): ``mindpipe tune``'s flags by
            default; :func:`mindpipe.tuner.api.build_space` passes its caller's.
    """

    model: Model | Supernet
    cluster: Cluster
    global_batches: list[int]
    fixes: dict[str, Any] = field(default_factory=dict)
    partitioners: tuple[str, ...] = ("balanced",)
    what_if: tuple[str, ...] = ()
    batch_given: bool = True
    search: tuple[str, ...] = ()
    points: list[Point] = field(default_factory=list, init=False, repr=False)  # thousands of plans
    rejected: Counter[Rule] = field(default_factory=Counter, init=False, repr=False)
    arg_names: InitVar[ArgNames] = CLI_ARG_NAMES

    def __post_init__(self, arg_names: ArgNames) -> None:
        n = arg_names
        if "partition" in self.fixes:
            self.partitioners = ("given",)
        self.partitioners = check_partitioners(self.partitioners, given_allowed="partition" in self.fixes, arg_names=n)
        if isinstance(self.model, Supernet):
            if self.search:
                raise ContractError(n.name("--search"), self.search[0], f"{self.search[0]} is not searched for supernets")
            check_supernet_fixes(self.model, self.fixes, self.what_if, self.partitioners, arg_names=n)
            self.points = list(supernet_points(self))
            return
        for key in SUPERNET_POINT_KEYS:
            if key in self.fixes:
                raise ContractError(n.name("--fix"), key, f"{key} applies to supernets only; {self.model.label} is a GPT model")
        for p in self.partitioners:
            if p in MEMORY_PARTITIONERS and "layer_memory_policy" in self.fixes:
                raise ContractError(n.name("--partitioner"), None,
                                    f"{p} chooses the layer_memory_policy itself; do not pin it")
        unknown = [k for k in self.what_if if k not in WHAT_IF_KEYS]
        if unknown:
            raise ContractError(n.name("--what-if"), unknown[0], f"{unknown[0]} is not a what-if knob")
        check_fixes_what_if(self.fixes, self.what_if, arg_names=n)
        unknown = [k for k in self.search if k not in SEARCH_ON_REQUEST_KEYS]
        if unknown:
            raise ContractError(n.name("--search"), unknown[0], f"{unknown[0]} is not searched on request "
                                f"(known: {', '.join(SEARCH_ON_REQUEST_KEYS)})")
        # The default space searches bf16 only; a pinned precision the devices lack (fp8 on an
        # A100 or a CPU) is refused here, by the plan rule's owner, instead of in every simulation.
        for prec in self.choices("precision", []):
            check_precision(prec, self.cluster.gpu, n.name("--fix"))
        self.points = list(self._enumerate())

    # -- choices per key -----------------------------------------------------------------------

    def choices(self, key: str, default: Iterable[Any]) -> list[Any]:
        """Allowed values of ``key``: the pinned ones, else ``default``."""
        return _as_list(self.fixes[key]) if key in self.fixes else list(default)

    def _pinned(self, key: str) -> bool:
        return key in self.fixes

    def _knob(self, key: str) -> list[Any]:
        """Values of a what-if knob: all of them when searched, else the one the executor runs."""
        return self.choices(key, _WHAT_IF_VALUES[key] if key in self.what_if else [WHAT_IF_KEYS[key]])

    def _on_request(self, key: str, values: Iterable[Any]) -> list[Any]:
        """Values of a key searched on request: ``values`` when ``search`` names it, else its default
        (:data:`~mindpipe.tuner.keys.OPTIONAL_POINT_KEYS`); pinned values win either way."""
        return self.choices(key, values if key in self.search else [OPTIONAL_POINT_KEYS[key]])

    @property
    def pinned(self) -> dict[str, list[Any]]:
        """The list keys pinned by ``--fix`` (``partition``, ``layer_memory_policy``), copied into every plan."""
        return {k: list(self.fixes[k]) for k in LIST_KEYS if k in self.fixes}

    @property
    def size(self) -> int:
        """Number of valid points."""
        return len(self.points)

    @property
    def rejected_total(self) -> int:
        """Combinations filtered by the rules before any evaluation."""
        return sum(self.rejected.values())

    # -- enumeration ---------------------------------------------------------------------------

    def _meshes(self) -> Iterator[tuple[int, int, int, int]]:
        """(dp, tp, pp, cp) with dp·tp·pp·cp = devices; cp = 1 unless searched or pinned."""
        world = self.cluster.world_size
        for tp in self.choices("tp", _divisors(world)):
            if world % tp:
                self.rejected[Rule.MESH] += 1
                continue
            if tp > self.cluster.gpus_per_node:
                self.rejected[Rule.TP_PER_NODE] += 1
                continue
            for pp in self.choices("pp", _divisors(world // tp)):
                if (world // tp) % pp:
                    self.rejected[Rule.MESH] += 1
                    continue
                rest = world // (tp * pp)
                for cp in self._on_request("cp", _divisors(rest)):
                    if rest % cp:
                        self.rejected[Rule.MESH] += 1
                        continue
                    dp = rest // cp
                    if self._pinned("dp") and dp not in self.choices("dp", []):
                        self.rejected[Rule.PINNED] += 1
                        continue
                    yield dp, tp, pp, cp

    def _schedules(self, pp: int) -> list[tuple[str, int]]:
        """(schedule, virtual stages) pairs to try with pp stages."""
        pairs: list[tuple[str, int]] = []
        for name in self.choices("schedule", SCHEDULES):
            fixed = fixed_virtual_stages(name)
            vs = [fixed] if fixed is not None else list(DEFAULT_INTERLEAVE)
            pairs += [(name, v) for v in self.choices("virtual_stages", vs)]
        if pp == 1 and not (self._pinned("schedule") and self._pinned("virtual_stages")):
            # One stage: every non-V schedule runs F then B per micro-batch; keep one representative.
            single = sorted((n, v) for n, v in pairs if v == 1)
            single.sort(key=lambda nv: nv[0] != "1f1b")
            pairs = single[:1] if single else pairs
        return pairs

    def _broken_rule(self, base: Point) -> Rule | None:
        """The rule a base point breaks (asked of the rules' owners), or None."""
        try:
            plan = plan_of(base, self.pinned)
        except ContractError as e:
            return rule_of(e, contract=True)
        try:
            if not isinstance(self.model, Model):
                raise TypeError("a supernet's points come from mindpipe.tuner.subnet_space")
            check_plan(plan, self.model, self.cluster)
        except ContractError as e:
            return rule_of(e)
        if schedule_rule(plan.schedule, plan.pp, plan.num_microbatches, plan.virtual_stages) is not None:
            return Rule.SCHEDULE
        return None

    def _bases(self) -> Iterator[Point]:
        """Valid points of the keys the rules look at (mesh, batch, schedule, sequence parallelism)."""
        for dp, tp, pp, cp in self._meshes():
            sp_choices = self.choices("sequence_parallel", [False, True] if tp > 1 else [False])
            # Context parallelism needs FlashAttention (the Plan's rule): a cp > 1 point carries it,
            # unless --fix flash_attention=false leaves the rule to refuse it.
            flash = {"flash_attention": True in self.choices("flash_attention", [True])} if cp > 1 else {}
            for mbs, gbs, (schedule, v), sp in itertools.product(
                    self.choices("micro_batch_size", DEFAULT_MICRO_BATCHES),
                    self.choices("global_batch_size", self.global_batches), self._schedules(pp), sp_choices):
                base = dict(dp=dp, tp=tp, pp=pp, cp=cp, micro_batch_size=mbs, global_batch_size=gbs, schedule=schedule,
                            virtual_stages=v, sequence_parallel=sp, **flash)
                rule = self._broken_rule(base)
                if rule is not None:
                    self.rejected[rule] += 1
                    continue
                yield base

    def _enumerate(self) -> Iterator[Point]:
        for base in self._bases():
            yield from self._rest(base)

    def _rest(self, base: Point) -> Iterator[Point]:
        """The base point times the keys no rule looks at (irrelevant ones collapsed)."""
        if not isinstance(self.model, Model):
            raise TypeError("a supernet's points come from mindpipe.tuner.subnet_space")
        knobs = self._comm_knobs(base)
        part_choices = self._partitioner_choices(base)
        recompute = self.choices("recompute", RECOMPUTE)
        if self._pinned("layer_memory_policy") and not self._pinned("recompute"):
            recompute = ["none"]  # the pinned per-block policies replace the level (the Plan's rule)
        flash_choices, chunk_choices, fused_choices = self._kernel_choices(base, self.model)
        # Fused norm/rotary/SwiGLU kernels change only a Llama block (ops.block_ops): one value for GPT.
        elementwise = self._knob("fused_elementwise")
        if not self.model.is_llama and not self._pinned("fused_elementwise"):
            elementwise = elementwise[:1]
        product = itertools.product(
            recompute, knobs.zero_stage, knobs.comm_priority, self.choices("precision", [PLAN_DEFAULTS["precision"]]),
            knobs.overlap_grad_reduce, knobs.tp_comm_overlap, knobs.overlap_param_gather, flash_choices, chunk_choices,
            fused_choices, knobs.blocking_p2p, elementwise, self._knob("dp_impl"),
            self.choices("rank_order", [PLAN_DEFAULTS["rank_order"]]), part_choices, knobs.cp_comm_type,
        )
        for rc, zero, comm, prec, ogr, tpo, opg, flash, chunks, fused, p2p, fel, impl, order, part, cpc in product:
            if part in MEMORY_PARTITIONERS and rc != recompute[0]:
                continue  # their per-block policy overrides the recompute level: one point, not one per level
            if tpo and not base["sequence_parallel"]:  # pinned: no sequence-parallel collectives (Plan's rule)
                self.rejected[Rule.PLAN] += 1
                continue
            if base["cp"] == 1 and cpc != OPTIONAL_POINT_KEYS["cp_comm_type"]:  # pinned: no K/V exchange (Plan's rule)
                self.rejected[Rule.CONTEXT_PARALLEL] += 1
                continue
            if fp8_tp_refusal(prec, base["tp"]) is not None:  # a searched plan is one the executor runs
                self.rejected[Rule.PLAN] += 1
                continue
            if opg and (zero not in (1, 2) or impl != "megatron"):  # no all-gather after the step (Plan's rules)
                if self._pinned("overlap_param_gather"):
                    self.rejected[Rule.PLAN] += 1
                continue
            point = dict(base, recompute=rc, zero_stage=zero, comm_priority=comm, precision=prec,
                         overlap_grad_reduce=ogr, tp_comm_overlap=tpo, overlap_param_gather=opg, flash_attention=flash,
                         loss_chunks=chunks, fused_head_loss=fused, blocking_p2p=p2p, fused_elementwise=fel,
                         dp_impl=impl, rank_order=order,
                         partitioner=part, cp_comm_type=cpc)
            yield {k: point[k] for k in POINT_KEYS}

    def _comm_knobs(self, base: Point) -> _CommKnobs:
        """The values of the communication keys for ``base``: one where its mesh makes a key moot."""
        pp, v = base["pp"], base["virtual_stages"]
        replicas = base["dp"] * base["cp"]  # ranks that reduce gradients together (Plan.grad_replicas)
        zero_choices = self.choices("zero_stage", [0, 1, 2, 3])
        ogr_choices = self._knob("overlap_grad_reduce")
        if replicas == 1:  # no data-parallel group: nothing to shard or to reduce
            zero_choices = zero_choices if self._pinned("zero_stage") else zero_choices[:1]
            ogr_choices = ogr_choices if self._pinned("overlap_grad_reduce") else ogr_choices[:1]
        tpo_choices = self._knob("tp_comm_overlap")
        if not base["sequence_parallel"] and not self._pinned("tp_comm_overlap"):
            tpo_choices = tpo_choices[:1]  # no sequence-parallel collectives to overlap (Plan's rule)
        opg_choices = self._knob("overlap_param_gather")
        if replicas == 1 and not self._pinned("overlap_param_gather"):
            opg_choices = opg_choices[:1]
        comm_choices = self._knob("comm_priority")
        if pp == 1 and not self._pinned("comm_priority"):
            comm_choices = comm_choices[:1]
        p2p_choices = self._knob("blocking_p2p")
        if pp * v == 1:  # no pipeline sends to block on
            p2p_choices = p2p_choices[:1]
        # Both K/V exchanges where there is context parallelism (the executor runs each).
        cp_comm_choices = self.choices("cp_comm_type", CP_COMM_TYPES if base["cp"] > 1 else
                                       [OPTIONAL_POINT_KEYS["cp_comm_type"]])
        return _CommKnobs(zero_choices, ogr_choices, tpo_choices, opg_choices, comm_choices, p2p_choices,
                          cp_comm_choices)

    def _partitioner_choices(self, base: Point) -> list[str]:
        """The partitioners to try for ``base`` (the memory-aware ones are refused under virtual stages)."""
        pp, v = base["pp"], base["virtual_stages"]
        part_choices = list(self.partitioners)
        if pp * v == 1:
            # One stage: only the memory-aware partitioners differ (they choose per-block policies).
            part_choices = list(dict.fromkeys(part_choices[:1] + [p for p in part_choices if p in MEMORY_PARTITIONERS]))
        if v > 1:  # the memory-aware partitioners plan one stage per rank
            memory = [p for p in part_choices if p in MEMORY_PARTITIONERS]
            self.rejected[Rule.VIRTUAL_STAGES] += len(memory)
            part_choices = [p for p in part_choices if p not in MEMORY_PARTITIONERS]
        return part_choices

    def _kernel_choices(self, base: Point, model: Model) -> tuple[list[Any], list[Any], list[Any]]:
        """The values of ``flash_attention``, ``loss_chunks`` and ``fused_head_loss`` for ``base`` of ``model``."""
        # Explicit attention unless pinned (--fix flash_attention=true, or both with [false,true]); a cp > 1
        # point carries FlashAttention (its base), and searching cp tries cp = 1 with it too, so that
        # context parallelism is weighed against plans with the same attention kernels.
        flash_default = [False, True] if "cp" in self.search else default_attention(model, self.cluster)
        flash_choices = [base["flash_attention"]] if "flash_attention" in base else self.choices("flash_attention",
                                                                                                  flash_default)
        # The unchunked loss unless pinned (--fix loss_chunks=8, or several: --fix loss_chunks=1,8).
        chunk_choices = self.choices("loss_chunks", [1])
        # The head outside the loss unless pinned (--fix fused_head_loss=true, or false,true).
        fused_choices = self.choices("fused_head_loss", [False])
        return flash_choices, chunk_choices, fused_choices

    def values(self, key: str) -> list[Any]:
        """The values ``key`` takes over the points, in first-seen order."""
        seen: list[Any] = []
        for p in self.points:
            if p[key] not in seen:
                seen.append(p[key])
        return seen

    def describe(self) -> dict[str, Any]:
        """JSON summary of the space: size, rejected counts, per-key value sets, what-if knobs searched."""
        keys = (*POINT_KEYS, *SUPERNET_POINT_KEYS) if isinstance(self.model, Supernet) else POINT_KEYS
        values = {key: self.values(key) for key in keys}
        return {"size": self.size, "rejected": self.rejected_total,
                "rejected_by_rule": {rule.value: n for rule, n in self.rejected.most_common()},
                "values": values, "what_if": list(self.what_if), "search": list(self.search)}


__all__ = ["DEFAULT_MICRO_BATCHES", "SearchSpace"]
