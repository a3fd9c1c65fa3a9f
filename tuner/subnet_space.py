"""The fourth dimension in the search space: the points of a supernet plan (NASPipe).

:class:`~mindpipe.tuner.space.SearchSpace` asks :func:`supernet_points` when its model is a
:class:`~mindpipe.traces.supernet.Supernet`. A supernet point searches

* the mesh dp × pp (tp = 1: :func:`~mindpipe.traces.supernet.check_supernet_plan` refuses tensor
  parallelism for supernets), every pp up to the choice layers;
* the micro-batch: one subnet trains one micro-batch per replica, so ``global_batch_size`` — the
  samples each subnet trains on — is micro_batch_size × dp. The tuner holds it fixed (``--global-batch``,
  default the GPT tuner's :func:`~mindpipe.tuner.api.default_global_batch`) so that subnets per hour
  compare plans that train every subnet on the same data; ``--fix micro_batch_size=M`` frees it
  instead (then every dp trains M per replica);
* ``subnet_schedule``: ``csp`` and ``sequential`` by default — the two whose training equals
  sequential training (:data:`~mindpipe.traces.config.SEQUENTIAL_EQUIVALENT_SCHEDULES`); ``sync``
  and ``async`` only on request (``--fix subnet_schedule=sync``), and labelled in every output;
* ``subnet_window``: CSP's look-ahead pp, 2·pp, 4·pp (for ``sync`` the subnets per batch, as the
  executor reads it); none for ``sequential`` and ``async``, which do not read it;
* the partitioner (:mod:`mindpipe.tuner.subnet_partition`: ``balanced``, ``even``).

Dimensions that cannot change the result collapse as in the GPT space: with one stage the window,
the partitioner, and CSP against sequential (CSP on one stage *is* sequential).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from mindpipe.traces.config import SEQUENTIAL_EQUIVALENT_SCHEDULES, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.supernet import Supernet, check_supernet_plan
from mindpipe.tuner.keys import (
    CLI_ARG_NAMES,
    OPTIONAL_POINT_KEYS,
    PLAN_DEFAULTS,
    POINT_KEYS,
    SUPERNET_POINT_KEYS,
    ArgNames,
    Point,
    plan_of,
)
from mindpipe.tuner.rules import Rule
from mindpipe.tuner.subnet_partition import SUPERNET_PARTITIONERS

if TYPE_CHECKING:
    from mindpipe.tuner.space import SearchSpace

WINDOW_FACTORS = (1, 2, 4)
"""CSP windows tried, in multiples of pp (the default window is 2·pp)."""
_WINDOWED = ("csp", "sync")
# Keys a supernet sweep may pin: the searched ones, the precision and the rank order.
_SUPERNET_FIXES = ("dp", "tp", "pp", "micro_batch_size", "precision", "rank_order", "partitioner", "partition",
                   *SUPERNET_POINT_KEYS)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def check_supernet_fixes(net: Supernet, fixes: dict[str, Any], what_if: tuple[str, ...],
                         partitioners: tuple[str, ...], *, arg_names: ArgNames = CLI_ARG_NAMES) -> None:
    """Refuse ``--fix``, ``--what-if`` and ``--partitioner`` values no supernet plan takes.

    The rule comes from :func:`~mindpipe.traces.supernet.check_supernet_plan` where it owns one
    (``tp=2``: tensor parallelism is not supported for supernets).

    Raises:
        ContractError: naming the argument (as ``arg_names`` does: ``mindpipe tune``'s flags by
            default), the key and the rule.
    """
    fix = arg_names.name("--fix")
    if what_if:
        raise ContractError(arg_names.name("--what-if"), what_if[0], "what-if knobs are not modelled for supernets")
    for p in partitioners:
        if p not in (*SUPERNET_PARTITIONERS, "given"):
            raise ContractError(arg_names.name("--partitioner"), None, f"{p!r} is not a supernet partitioner "
                                f"({', '.join(SUPERNET_PARTITIONERS)})")
    for key, value in fixes.items():
        if key == "global_batch_size":
            raise ContractError(fix, key, "a supernet's global batch is the samples each subnet trains on "
                                f"(micro_batch_size × dp): give it with {arg_names.name('--global-batch')}")
        probe_values = _as_list(value) if key not in ("partition", "layer_memory_policy") else [value]
        if key not in _SUPERNET_FIXES or key == "tp":
            for v in probe_values:
                try:
                    probe = Plan(**{"dp": 1, "pp": 1, "micro_batch_size": 1, "global_batch_size": 1, key: v})
                    check_supernet_plan(probe, net, source=fix)
                except ContractError as e:
                    raise ContractError(fix, key, e.rule) from None
            if key != "tp":
                raise ContractError(fix, key, f"{key} is not searched for supernets (pin one of "
                                    f"{', '.join(k for k in _SUPERNET_FIXES if k != 'tp')})")


def _windows(space: SearchSpace, name: str, pp: int) -> list[int | None]:
    if name not in _WINDOWED:
        return [None]
    default: list[int | None] = [f * pp for f in WINDOW_FACTORS]
    if pp == 1 and name == "csp":
        default = [None]  # one stage runs F then B of each subnet whatever the window: keep the default
    return space.choices("subnet_window", default)


def _schedules(space: SearchSpace, pp: int) -> list[str]:
    names = space.choices("subnet_schedule", SEQUENTIAL_EQUIVALENT_SCHEDULES)
    if pp == 1 and "csp" in names and "sequential" in names and not space._pinned("subnet_schedule"):
        names = [n for n in names if n != "sequential"]  # CSP on one stage is sequential training
    return names


def _batches(space: SearchSpace, dp: int) -> Iterator[tuple[int, int]]:
    """(micro_batch_size, global_batch_size) pairs for ``dp`` replicas."""
    if space._pinned("micro_batch_size") and not space.batch_given:
        for mbs in space.choices("micro_batch_size", []):
            yield mbs, mbs * dp
        return
    for gbs in space.global_batches:
        if gbs % dp:
            space.rejected[Rule.BATCH_MULTIPLE] += 1
            continue
        if gbs // dp not in space.choices("micro_batch_size", [gbs // dp]):
            space.rejected[Rule.PINNED] += 1
            continue
        yield gbs // dp, gbs


def supernet_points(space: SearchSpace) -> Iterator[Point]:
    """Every valid supernet point of ``space`` (module docstring), rejected combinations counted."""
    net, world = space.model, space.cluster.world_size
    if not isinstance(net, Supernet):
        raise TypeError("supernet_points needs a supernet")
    for pp in space.choices("pp", [d for d in range(1, world + 1) if world % d == 0]):
        if world % pp:
            space.rejected[Rule.MESH] += 1
            continue
        if pp > net.num_layers:
            space.rejected[Rule.LAYERS] += 1
            continue
        dp = world // pp
        if space._pinned("dp") and dp not in space.choices("dp", []):
            space.rejected[Rule.PINNED] += 1
            continue
        parts = list(space.partitioners)[:1] if pp == 1 else list(space.partitioners)
        for mbs, gbs in _batches(space, dp):
            for name in _schedules(space, pp):
                for window in _windows(space, name, pp):
                    for precision in space.choices("precision", [PLAN_DEFAULTS["precision"]]):
                        for order in space.choices("rank_order", [PLAN_DEFAULTS["rank_order"]]):
                            for part in parts:
                                point = _point(space, net, dp, pp, mbs, gbs, name, window, precision, order, part)
                                if point is not None:
                                    yield point


def _point(space: SearchSpace, net: Supernet, dp: int, pp: int, mbs: int, gbs: int, name: str,
           window: int | None, precision: str, order: str, part: str) -> Point | None:
    """One point, or None (counted) when a rule's owner refuses its plan."""
    point: Point = {k: OPTIONAL_POINT_KEYS.get(k) for k in POINT_KEYS}
    point.update(dp=dp, tp=1, pp=pp, micro_batch_size=mbs, global_batch_size=gbs, schedule="1f1b", virtual_stages=1,
                 recompute="none", sequence_parallel=False, zero_stage=0, comm_priority="fair", precision=precision,
                 overlap_grad_reduce=False, tp_comm_overlap=False, overlap_param_gather=False,
                 rank_order=order, partitioner=part, subnet_schedule=name,
                 subnet_window=window)
    try:
        check_supernet_plan(plan_of(point, space.pinned), net, space.cluster)
    except ContractError as e:
        space.rejected[Rule.PARTITION if e.key == "partition" else Rule.PLAN] += 1
        return None
    return point


def equivalent_to_sequential(point: Point) -> bool | None:
    """Whether a supernet point trains exactly as sequential training (None for a GPT point)."""
    name = point.get("subnet_schedule")
    return None if name is None else name in SEQUENTIAL_EQUIVALENT_SCHEDULES


__all__ = ["WINDOW_FACTORS", "check_supernet_fixes", "equivalent_to_sequential", "supernet_points"]
