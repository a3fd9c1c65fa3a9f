"""Supernet partitioners: how many choice layers each pipeline stage holds.

A supernet stage's time changes from subnet to subnet (each picks its own candidates), so the
partition balances the *expected* stage time under the sampler. With uniform sampling every
candidate of a layer is chosen with probability 1/K, so by linearity of expectation a stage's
expected time per subnet is

    E[T_s] = L_s · (1/K) Σ_k (F_k + B_k)  +  [s = 0] · (F + B)_embedding  +  [s = p−1] · (F + B)_head,

the layers' mean candidate cost plus the shared parts it holds (the embedding on the first stage;
the final norm, LM head and loss on the last — heavy for a large vocabulary, which is why an even
split makes the last stage the bottleneck of every schedule alike). Forward and the whole backward
count, as every supernet schedule runs both per subnet on the stage.

Two rules (the ``--partitioner`` values the supernet tuner searches):

* ``even`` — equal layer counts (:func:`~mindpipe.traces.config.even_partition`);
* ``balanced`` — every stage starts with one layer, then each further layer goes to the stage
  whose E[T_s] is lowest (ties: the later stage, so early stages — which hold the most subnets in
  flight — get fewer, as the GPT ``balanced`` rule does). Layers cost the same in expectation, so
  this water-filling yields the lexicographically smallest sorted vector of stage times: the
  min–max optimum of :func:`~mindpipe.tuner.partition.minmax_partition` (the GPT tuner's exact
  rule over the same loads) *and*, among its many ties, the split that spreads the rest evenly. The
  tie matters for a supernet: with a heavy head the last stage sets the bottleneck, and a plain
  min–max is free to pile the other layers onto a few stages, where more layers mean more CSP
  conflicts (1 − (1 − 1/K)^{L_s}).

A supernet whose layers choose from their own lists (``layer_candidates``) has a mean per layer,
``(1/K_l) Σ_{k ∈ layer l} (F_k + B_k)``, and layers no longer cost the same in expectation (the
water-filling argument needs equal layers). ``balanced`` then takes the bottleneck of
:func:`~mindpipe.tuner.partition.minmax_partition` over those per-layer means and, among the splits
that keep it, the most even one (least sum of squared stage loads, :func:`even_minmax_partition`;
ties: the later stage gets more): min–max alone fills stages from the back and is free to pile
layers onto a few of them, the same tie the water-fill resolves for equal layers.

The expected cost, not a particular draw's, is what a long run of subnets sees; the per-subnet
variation around it is what CSP's look-ahead window absorbs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from mindpipe.simulator.subnet_costs import PartCost, SupernetCosts
from mindpipe.traces.config import check_stage_count, even_partition
from mindpipe.traces.errors import ContractError
from mindpipe.traces.supernet import water_fill
from mindpipe.tuner.partition import minmax_partition, stage_loads

SUPERNET_PARTITIONERS = ("balanced", "even")


def _load(part: PartCost) -> float:
    return part.forward_s + part.backward_s


def layer_loads(costs: SupernetCosts) -> list[float]:
    """Expected forward + backward seconds of each choice layer under uniform sampling: the mean of its candidates."""
    net = costs.supernet
    return [sum(_load(costs.candidates[k]) for k in net.layer_choices(layer)) / len(net.layer_choices(layer))
            for layer in range(net.num_layers)]


def mean_layer_load(costs: SupernetCosts) -> float:
    """Expected forward + backward seconds of a choice layer, averaged over the layers (:func:`layer_loads`)."""
    loads = layer_loads(costs)
    return sum(loads) / len(loads)


def shared_loads(costs: SupernetCosts) -> tuple[float, float]:
    """Forward + backward seconds of (the embedding, the final norm + LM head + loss)."""
    return _load(costs.embedding), _load(costs.head)


def expected_stage_loads(costs: SupernetCosts, partition: Sequence[int]) -> list[float]:
    """E[T_s] per stage (module docstring) for ``partition`` (choice layers per stage)."""
    first, last = shared_loads(costs)
    return stage_loads(partition, layer_loads(costs), first, last)


def balanced_supernet_partition(costs: SupernetCosts, num_stages: int) -> list[int]:
    """Choice layers per stage minimising the largest expected stage time, the rest spread evenly (``balanced``).

    Raises:
        ContractError: more stages than choice layers.
    """
    first, last = shared_loads(costs)
    loads = layer_loads(costs)
    if costs.supernet.uniform_layers or max(loads) - min(loads) <= 1e-12 * max(loads):
        return water_fill(costs.supernet.num_layers, num_stages, sum(loads) / len(loads), first, last)
    return even_minmax_partition(loads, num_stages, first, last)


def even_minmax_partition(loads: Sequence[float], num_stages: int, first: float = 0.0,
                          last: float = 0.0) -> list[int]:
    """Layers per stage: :func:`~mindpipe.tuner.partition.minmax_partition`'s bottleneck, then the
    most even split that keeps it (least sum of squared stage loads; ties: later stages hold more).

    An exact dynamic program over (stage, end layer) under the bottleneck, O(stages × layers²).

    Raises:
        ContractError: more stages than layers.
    """
    n, p = len(loads), num_stages
    bound = max(stage_loads(minmax_partition(loads, p, first, last), loads, first, last))
    bound = bound * (1 + 1e-9) + 1e-30
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(loads, dtype=float))])
    cost = np.full((p, n + 1), np.inf)  # cost[k, j]: stages 0..k hold layers [0, j)
    start = np.zeros((p, n + 1), dtype=int)  # where stage k starts in that best split
    head = first + prefix[1:] + (last if p == 1 else 0.0)
    cost[0, 1:] = np.where(head <= bound, head ** 2, np.inf)
    for k in range(1, p):
        extra = last if k == p - 1 else 0.0
        for j in range(k + 1, n - (p - 1 - k) + 1):
            i = np.arange(k, j)  # stage k holds layers [i, j)
            seg = prefix[j] - prefix[i] + extra
            total = cost[k - 1, i] + np.where(seg <= bound, seg ** 2, np.inf)
            m = int(np.argmin(total))  # the first minimum: the earliest start, so the later stage holds more
            cost[k, j], start[k, j] = total[m], i[m]
    out, end = [0] * p, n
    for k in range(p - 1, 0, -1):
        out[k] = end - int(start[k, end])
        end = int(start[k, end])
    out[0] = end
    return out


def supernet_partition(name: str, costs: SupernetCosts, num_stages: int) -> list[int]:
    """Choice layers per stage by the named rule (``balanced`` or ``even``).

    Raises:
        ContractError: an unknown rule, or more stages than choice layers.
    """
    layers = costs.supernet.num_layers
    check_stage_count(num_stages, layers, "choice layer")
    if name == "even":
        return even_partition(layers, num_stages)
    if name == "balanced":
        return balanced_supernet_partition(costs, num_stages)
    raise ContractError("--partitioner", None, f"{name!r} is not a supernet partitioner "
                        f"({', '.join(SUPERNET_PARTITIONERS)})")


__all__ = [
    "SUPERNET_PARTITIONERS",
    "balanced_supernet_partition",
    "even_minmax_partition",
    "expected_stage_loads",
    "layer_loads",
    "mean_layer_load",
    "shared_loads",
    "supernet_partition",
    "water_fill",
]
