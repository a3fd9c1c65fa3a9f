"""Peak device memory of each pipeline stage of a supernet run, with and without context switching.

A stage holds (NASPipe, ASPLOS'22 §5 "context switch"; BACKGROUND.md §5):

* **parameters** — without context switching its whole slice of the supernet (every candidate of
  its layers) and its shared parts; with it, the shared parts and only the chosen candidates of
  the subnets *resident* on the stage: those in flight (forward started, update not yet applied)
  plus the next subnet in the stage's forward order, which is being prefetched
  (:mod:`mindpipe.simulator.subnet_replay` copies one subnet ahead);
* **gradients and optimizer state** of the resident trained parameters
  (:func:`mindpipe.simulator.memory.model_state_bytes`: mixed-precision Adam); frozen shared parts
  (``train_shared=false``) keep their weights only;
* **activations** of the subnets in flight — each subnet's own saved bytes on the stage, summed
  (``in_flight_peak × activation bytes`` when the subnets cost the same);
* the framework's reserved bytes on a GPU (:data:`mindpipe.simulator.memory.GPU_RESERVED_BYTES`).

The peak is taken over the stage's order: after every forward, with the subnets then resident.
A ``sync`` schedule keeps a batch's subnets resident until the batch's update at its end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mindpipe.simulator.costs import DTYPE_BYTES
from mindpipe.simulator.memory import GPU_RESERVED_BYTES, model_state_bytes
from mindpipe.simulator.subnet_costs import SupernetCosts
from mindpipe.simulator.subnet_schedules import SubnetSchedule
from mindpipe.traces.catalog import DeviceSpec
from mindpipe.traces.config import Plan
from mindpipe.traces.result import StageMemoryParts
from mindpipe.traces.supernet import Choices


@dataclass(frozen=True)
class StageMemory(StageMemoryParts):
    """Peak memory of one pipeline stage, in bytes.

    Attributes:
        weights_bytes, gradients_bytes, optimizer_bytes: Model states at the peak.
        activations_bytes: Saved activations of the subnets in flight at the peak.
        other_bytes: Reserved framework memory.
        total_bytes: Sum of the above.
        stage: Pipeline stage.
        context_switching: Whether only resident subnets' candidates are on the device.
        param_count: Parameters on the device at the peak.
        capacity_bytes: The device's memory (or the budget given).
        fits: ``total_bytes <= capacity_bytes``.
        in_flight_peak: Most subnets in flight on the stage at once.
    """

    stage: int
    context_switching: bool
    param_count: int
    capacity_bytes: float
    fits: bool
    in_flight_peak: int



def _states(shared: int, shared_trained: bool, trained: int, plan: Plan) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes of ``shared`` + ``trained`` parameters."""
    w, g, o = model_state_bytes(trained + (shared if shared_trained else 0), plan)
    if not shared_trained:
        w += shared * DTYPE_BYTES[plan.precision]
    return w, g, o


def stage_memory(costs: SupernetCosts, plan: Plan, device: DeviceSpec, schedule: SubnetSchedule,
                 subnets: Sequence[Choices], layers: Sequence[int], context_switching: bool,
                 capacity_bytes: float | None = None) -> list[StageMemory]:
    """Peak memory of every stage of ``schedule`` (module docstring).

    Args:
        costs: Candidate and shared-part costs (parameters, activation bytes).
        plan: The plan (precision, dp for the state sharding rules).
        device: The device (reserved bytes on GPUs, capacity).
        schedule: The per-stage orders.
        subnets: Choice vector of every subnet, in subnet order.
        layers: Choice layers per stage.
        context_switching: Only resident subnets' candidates on the device.
        capacity_bytes: A per-device budget instead of the device's memory.
    """
    p = schedule.num_stages
    cap = float(device.memory_capacity_bytes if capacity_bytes is None else capacity_bytes)
    other = 0.0 if device.kind == "cpu" else float(GPU_RESERVED_BYTES)
    trained_shared = costs.supernet.train_shared
    out: list[StageMemory] = []
    first = 0
    for s in range(p):
        n_layers = layers[s]
        shared, every = costs.stage_params(first, n_layers, s == 0, s == p - 1)
        acts = [costs.stage(c, first, n_layers, s == 0, s == p - 1).activation_bytes for c in subnets]
        cand_params = [c.param_count for c in costs.candidates]
        fwd = [a.microbatch for a in schedule.orders[s] if a.kind == "F"]
        resident: dict[int, None] = {}  # in flight, in order
        pending: list[int] = []  # backward done, update waits for the batch end (sync)
        best: tuple[float, ...] = (0.0,) * 5 + (0,)
        peak_flight, nf = 0, 0
        for a in schedule.orders[s]:
            b = a.microbatch
            if a.kind == "B":
                pending.append(b)
                if schedule.update == "each_backward" or (b + 1) % schedule.batch == 0 or b == len(subnets) - 1:
                    for w in pending:
                        resident.pop(w, None)
                    pending.clear()
                continue
            resident[b] = None
            nf += 1
            flying = [w for w in resident if w not in pending]
            peak_flight = max(peak_flight, len(flying))
            if context_switching:
                on = list(resident) + fwd[nf:nf + 1]  # the next subnet is being prefetched
                keys = {(layer, subnets[w][layer]) for w in on for layer in range(first, first + n_layers)}
                trained = sum(cand_params[k] for _, k in keys)
            else:
                trained = every
            w_b, g_b, o_b = _states(shared, trained_shared, trained, plan)
            act = sum(acts[w] for w in flying)
            total = w_b + g_b + o_b + act + other
            if total > best[0]:
                best = (total, w_b, g_b, o_b, act, shared + trained)
        total, w_b, g_b, o_b, act, params = best
        out.append(StageMemory(weights_bytes=w_b, gradients_bytes=g_b, optimizer_bytes=o_b, activations_bytes=act,
                               other_bytes=other, total_bytes=total, stage=s, context_switching=context_switching,
                               param_count=int(params), capacity_bytes=cap, fits=total <= cap, in_flight_peak=peak_flight))
        first += n_layers
    return out


__all__ = ["StageMemory", "stage_memory"]
