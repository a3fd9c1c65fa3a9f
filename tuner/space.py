"""The search space of 4D plans for a (model, cluster), enumerated and filtered by the plan rules.

A *point* is a plain dict of plan keys (without ``partition``) plus ``partitioner`` — the name of
the rule that will write the partition (:mod:`mindpipe.tuner.partition`). The space lists every point
that satisfies the structural rules (issue 6, point 1): dp·tp·pp = devices, tp ≤ devices per node
and dividing the heads (and the MLP width), pp·v ≤ layers, global batch a multiple of
micro-batch × dp, the schedule's micro-batch rules (:func:`mindpipe.simulator.schedules.build_schedule` is
the one authority) and :func:`mindpipe.traces.config.check_plan`. Combinations that break a rule are counted
per rule, so the output can say how many were filtered and why.

Dimensions that cannot change the result are not multiplied out (the first allowed value is
kept): the schedule, virtual stages, partitioner and ``comm_priority`` when there is one pipeline
stage, the ZeRO stage when dp = 1, sequence parallelism when tp = 1. ``--fix KEY=VALUE`` pins a
key (``KEY=A,B`` restricts it to a set); pinned keys are never dropped by that rule, only
restricted.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from mindpipe.traces.config import (
    COMM_PRIORITIES,
    PRECISIONS,
    RANK_ORDERS,
    RECOMPUTE,
    SCHEDULES,
    V_SCHEDULES,
    Cluster,
    Model,
    Plan,
    check_plan,
)
from mindpipe.traces.errors import ContractError

PARTITIONERS = ("balanced", "pipedream", "even", "given")
# Keys a point (and --fix) may carry; order fixes the column order of the output tables.
POINT_KEYS = (
    "dp", "tp", "pp", "micro_batch_size", "global_batch_size", "schedule", "virtual_stages", "recompute",
    "sequence_parallel", "zero_stage", "comm_priority", "precision", "overlap_grad_reduce", "rank_order",
    "partitioner",
)
LIST_KEYS = ("partition", "layer_memory_policy")  # pinned as JSON lists, copied into every plan
_INT_KEYS = ("dp", "tp", "pp", "micro_batch_size", "global_batch_size", "virtual_stages", "zero_stage")
_BOOL_KEYS = ("sequence_parallel", "overlap_grad_reduce")
_STR_CHOICES: dict[str, tuple[str, ...]] = {
    "schedule": SCHEDULES, "recompute": RECOMPUTE, "comm_priority": COMM_PRIORITIES, "precision": PRECISIONS,
    "rank_order": RANK_ORDERS, "partitioner": PARTITIONERS,
}
DEFAULT_MICRO_BATCHES = (1, 2, 4, 8)
DEFAULT_INTERLEAVE = (2, 4)  # virtual stages tried for interleaved_1f1b (Megatron uses 2-4 chunks)

Point = dict[str, Any]


def _parse_scalar(key: str, text: str) -> Any:
    text = text.strip()
    if key in _INT_KEYS:
        try:
            return int(text)
        except ValueError:
            raise ContractError("--fix", key, f"{key}={text!r} must be an integer") from None
    if key in _BOOL_KEYS:
        low = text.lower()
        if low not in ("true", "false", "1", "0", "yes", "no"):
            raise ContractError("--fix", key, f"{key}={text!r} must be true or false")
        return low in ("true", "1", "yes")
    allowed = _STR_CHOICES[key]
    if text not in allowed:
        raise ContractError("--fix", key, f"{key}={text!r} is not one of {', '.join(allowed)}")
    return text


def parse_fixes(items: Iterable[str]) -> dict[str, Any]:
    """Parse ``--fix KEY=VALUE`` arguments.

    ``KEY=A,B`` restricts a key to a set of values (a list); ``partition`` and
    ``layer_memory_policy`` take a JSON list (``partition=[3,5]``); ``partition`` also pins the
    partitioner to ``given``.

    Raises:
        ContractError: unknown key, malformed value, or a key pinned twice.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep:
            raise ContractError("--fix", None, f"{item!r} is not KEY=VALUE")
        if key in out:
            raise ContractError("--fix", key, f"{key} is pinned twice")
        if key in LIST_KEYS:
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError:
                raise ContractError("--fix", key, f"{key} must be a JSON list, e.g. {key}=[4,4]") from None
            if not isinstance(parsed, list):
                raise ContractError("--fix", key, f"{key} must be a JSON list, e.g. {key}=[4,4]")
            out[key] = parsed
        elif key in POINT_KEYS:
            values = [_parse_scalar(key, v) for v in value.split(",")]
            out[key] = values[0] if len(values) == 1 else values
        else:
            known = ", ".join((*POINT_KEYS, *LIST_KEYS))
            raise ContractError("--fix", key, f"{key}: not a plan key (known: {known})")
    return out


def parse_global_batch(text: str) -> list[int]:
    """``N``, ``A,B,C`` or ``A:B`` (A, 2A, 4A … up to B) into a sorted list of global batch sizes."""
    try:
        if ":" in text:
            lo_s, hi_s = text.split(":", 1)
            lo, hi = int(lo_s), int(hi_s)
            if lo <= 0 or hi < lo:
                raise ValueError
            out, g = [], lo
            while g <= hi:
                out.append(g)
                g *= 2
            return out
        values = sorted({int(v) for v in text.split(",")})
    except ValueError:
        raise ContractError("--global-batch", None, f"{text!r} is not N, A,B,C or A:B with 0 < A <= B") from None
    if not values or values[0] <= 0:
        raise ContractError("--global-batch", None, f"{text!r}: global batch sizes must be > 0")
    return values


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


@lru_cache(maxsize=4096)
def _schedule_rule(name: str, pp: int, m: int, v: int) -> str | None:
    """None if ``build_schedule`` accepts (name, pp, m, v), else the rule it reports."""
    # The schedule module's own argument check (without building the action lists, ~20 ms each),
    # so the tuner and the simulator cannot disagree on which (schedule, m, v) are valid.
    from mindpipe.simulator.schedules import _check

    try:
        _check(name, pp, m, v)
    except ContractError as e:
        return e.rule
    return None


@dataclass
class SearchSpace:
    """Every structurally valid plan point for ``model`` on ``cluster``.

    Attributes:
        model, cluster: What is being planned.
        global_batches: Global batch sizes to try (one value = fixed).
        fixes: Parsed ``--fix`` values (see :func:`parse_fixes`).
        partitioners: Partitioners to try (a dimension when more than one).
        points: The valid points, in a stable enumeration order.
        rejected: Count of rejected combinations per broken rule (generic wording).
    """

    model: Model
    cluster: Cluster
    global_batches: list[int]
    fixes: dict[str, Any] = field(default_factory=dict)
    partitioners: tuple[str, ...] = ("balanced",)
    points: list[Point] = field(default_factory=list, init=False)
    rejected: Counter[str] = field(default_factory=Counter, init=False)

    def __post_init__(self) -> None:
        if "partition" in self.fixes:
            self.partitioners = ("given",)
        for p in self.partitioners:
            if p not in PARTITIONERS or (p == "given" and "partition" not in self.fixes):
                raise ContractError("--partitioner", None, f"{p!r} is not one of balanced, pipedream, even")
        self.points = list(self._enumerate())

    # -- choices per key -----------------------------------------------------------------------

    def choices(self, key: str, default: Iterable[Any]) -> list[Any]:
        """Allowed values of ``key``: the pinned ones, else ``default``."""
        return _as_list(self.fixes[key]) if key in self.fixes else list(default)

    def _pinned(self, key: str) -> bool:
        return key in self.fixes

    @property
    def size(self) -> int:
        """Number of valid points."""
        return len(self.points)

    @property
    def rejected_total(self) -> int:
        """Combinations filtered by the rules before any evaluation."""
        return sum(self.rejected.values())

    def _reject(self, rule: str) -> None:
        self.rejected[rule] += 1

    # -- enumeration ---------------------------------------------------------------------------

    def _meshes(self) -> Iterator[tuple[int, int, int]]:
        model, world = self.model, self.cluster.world_size
        for tp in self.choices("tp", _divisors(world)):
            if world % tp:
                self._reject("dp·tp·pp must equal the device count")
                continue
            if tp > self.cluster.gpus_per_node:
                self._reject("tp must not exceed devices per node")
                continue
            if model.num_heads % tp or model.ffn % tp:
                self._reject("tp must divide num_heads and ffn_hidden_size")
                continue
            for pp in self.choices("pp", _divisors(world // tp)):
                if (world // tp) % pp:
                    self._reject("dp·tp·pp must equal the device count")
                    continue
                if pp > model.num_layers:
                    self._reject("pp must not exceed num_layers")
                    continue
                dp = world // (tp * pp)
                if self._pinned("dp") and dp not in self.choices("dp", []):
                    self._reject("dp pinned by --fix")
                    continue
                yield dp, tp, pp

    def _schedules(self, pp: int, m: int) -> Iterator[tuple[str, int]]:
        """(schedule, virtual stages) pairs valid for pp stages and m micro-batches."""
        names = self.choices("schedule", SCHEDULES)
        pairs: list[tuple[str, int]] = []
        for name in names:
            if name in V_SCHEDULES:
                vs = [2]
            elif name == "interleaved_1f1b":
                vs = [v for v in DEFAULT_INTERLEAVE]
            else:
                vs = [1]
            pairs += [(name, v) for v in self.choices("virtual_stages", vs)]
        if pp == 1 and not (self._pinned("schedule") and self._pinned("virtual_stages")):
            # One stage: every non-V schedule runs F then B per micro-batch; keep one representative.
            single = sorted((n, v) for n, v in pairs if v == 1)
            single.sort(key=lambda nv: nv[0] != "1f1b")
            pairs = single[:1] if single else pairs
        for name, v in pairs:
            if pp * v > self.model.num_layers:
                self._reject("pp×virtual_stages must not exceed num_layers")
                continue
            rule = _schedule_rule(name, pp, m, v)
            if rule is not None:
                self._reject(_generic_rule(rule))
                continue
            if name != "gpipe" and pp > 1 and m < pp:
                self._reject("the schedule needs at least pp micro-batches")
                continue
            yield name, v

    def _enumerate(self) -> Iterator[Point]:
        model = self.model
        for dp, tp, pp in self._meshes():
            for mbs in self.choices("micro_batch_size", DEFAULT_MICRO_BATCHES):
                for gbs in self.choices("global_batch_size", self.global_batches):
                    if gbs % (mbs * dp):
                        self._reject("global batch must be a multiple of micro-batch×dp")
                        continue
                    m = gbs // (mbs * dp)
                    for schedule, v in self._schedules(pp, m):
                        yield from self._rest(dict(dp=dp, tp=tp, pp=pp, micro_batch_size=mbs, global_batch_size=gbs,
                                                   schedule=schedule, virtual_stages=v), model)

    def _rest(self, base: Point, model: Model) -> Iterator[Point]:
        dp, tp, pp, v = base["dp"], base["tp"], base["pp"], base["virtual_stages"]
        sp_choices = self.choices("sequence_parallel", [False, True])
        if tp == 1:
            if sp_choices == [True]:
                self._reject("sequence_parallel needs tp > 1")
                return
            sp_choices = [False]
        elif model.seq_len % tp:
            sp_choices = [s for s in sp_choices if not s] or []
            if not sp_choices:
                self._reject("sequence_parallel needs tp to divide seq_len")
                return
        zero_choices = self.choices("zero_stage", [0, 1, 2, 3])
        if dp == 1 and not self._pinned("zero_stage"):
            zero_choices = zero_choices[:1]
        comm_choices = self.choices("comm_priority", COMM_PRIORITIES)
        if pp == 1 and not self._pinned("comm_priority"):
            comm_choices = comm_choices[:1]
        part_choices = list(self.partitioners)
        if pp * v == 1:
            part_choices = part_choices[:1]
        product = itertools.product(
            self.choices("recompute", RECOMPUTE), sp_choices, zero_choices, comm_choices,
            self.choices("precision", ["bf16"]), self.choices("overlap_grad_reduce", [True]),
            self.choices("rank_order", ["tp-dp-pp"]), part_choices,
        )
        checked: dict[bool, str | None] = {}
        for rc, sp, zero, comm, prec, ogr, order, part in product:
            point = dict(base, recompute=rc, sequence_parallel=sp, zero_stage=zero, comm_priority=comm,
                         precision=prec, overlap_grad_reduce=ogr, rank_order=order, partitioner=part)
            # check_plan's rules depend on the mesh, batch, schedule and sequence parallelism only
            # (and the pinned lists), so one check per base point and SP value is enough.
            if sp not in checked:
                try:
                    check_plan(self.plan_of(point), model, self.cluster)
                    checked[sp] = None
                except ContractError as e:
                    checked[sp] = _generic_rule(e.rule)
            rule = checked[sp]
            if rule is not None:
                self._reject(rule)
                continue
            yield point

    def plan_of(self, point: Point, partition: list[int] | None = None) -> Plan:
        """The :class:`Plan` of a point (pinned list keys and ``partition`` copied in)."""
        kwargs = {k: point[k] for k in POINT_KEYS if k != "partitioner"}
        for key in LIST_KEYS:
            if key in self.fixes:
                kwargs[key] = list(self.fixes[key])
        if partition is not None:
            kwargs["partition"] = list(partition)
        try:
            return Plan(**kwargs)
        except ContractError as e:
            raise ContractError("--fix", e.key, e.rule) from None

    def describe(self) -> dict[str, Any]:
        """JSON summary of the space: size, rejected counts, per-key value sets."""
        values: dict[str, list[Any]] = {}
        for key in POINT_KEYS:
            seen: list[Any] = []
            for p in self.points:
                if p[key] not in seen:
                    seen.append(p[key])
            values[key] = seen
        return {"size": self.size, "rejected": self.rejected_total, "rejected_by_rule": dict(self.rejected),
                "values": values}


def point_key(point: Point) -> str:
    """Canonical, stable identity of a point (used by the sweep store)."""
    return json.dumps([point[k] for k in POINT_KEYS], separators=(",", ":"))


def _generic_rule(rule: str) -> str:
    """Replace the numbers in a rule so rejections group (``m=3 >= pp=4`` → ``m=N >= pp=N``)."""
    return re.sub(r"(?<![A-Za-z_])\d+(\.\d+)?", "N", rule)


__all__ = [
    "DEFAULT_MICRO_BATCHES",
    "PARTITIONERS",
    "POINT_KEYS",
    "Point",
    "SearchSpace",
    "parse_fixes",
    "parse_global_batch",
    "point_key",
]
