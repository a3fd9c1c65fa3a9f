"""Turn the ranks' measurements into the measured trace and its timeline (rank 0).

The result is a :class:`mindpipe.traces.trace.Trace` with a :class:`mindpipe.traces.measured.Measurement`: the
simulator reads its per-layer records like any trace, calibration reads the raw timings.
Everything here is measured — timing, allocator and tensor accounting — and nothing comes from a
cost model: per-layer records are medians of the layer segments timed inside the actions
(:mod:`mindpipe.executor.layer_records`), MFU's numerator is the model-FLOPs count of the data
contracts (:mod:`mindpipe.traces.flops`). Times include what ran inside the actions: TP
collectives, FSDP gathers, and the forward recompute of recomputed blocks (see
``provenance.notes``). The ranks' payloads are the typed records of :mod:`mindpipe.executor.payload`.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from mindpipe.executor.config import RunConfig
from mindpipe.executor.layer_records import LAYER_TIMES, layer_table
from mindpipe.executor.payload import RankPayload
from mindpipe.executor.precheck import Precheck
from mindpipe.traces.catalog import DeviceSpec, describes_this_host, get_device
from mindpipe.traces.chrome_trace import TimelineEvent, chunk_of, write_chrome_trace
from mindpipe.traces.flops import model_flops_per_iteration
from mindpipe.traces.measured import (
    ActionRecord,
    CommEvent,
    Measurement,
    OptimizerRecord,
    RankRecord,
    StepRecord,
    measured_steps,
    typical_iteration_s,
)
from mindpipe.traces.trace import Provenance, Trace
from mindpipe.traces.what_if import WHAT_IF_KEYS, plan_value, what_if_used

_CATEGORY = {"p2p_wait": "p2p", "dp_sync": "dp"}


def _timeline(payloads: list[RankPayload]) -> list[TimelineEvent]:
    events: list[TimelineEvent] = []
    for p in payloads:
        r = p.rank
        chunk = chunk_of((r, a.stage) for a in p.spans.actions)
        events += [TimelineEvent(r, "compute", f"{a.kind}{a.microbatch} stage {a.stage}", a.start_s, a.end_s, a.kind,
                                 a.step, chunk[r, a.stage]) for a in p.spans.actions]
        events += [TimelineEvent(r, "compute", "optimizer", o.start_s, o.end_s, "optimizer", o.step)
                   for o in p.spans.optimizer]
        events += [TimelineEvent(r, "comm", f"{c.op} ({c.axis})", c.start_s, c.end_s, _CATEGORY.get(c.kind, c.axis),
                                 c.step) for c in p.spans.comms]
    return events


def _energy(payloads: list[RankPayload], spec: DeviceSpec | None, iteration_s: float,
            n_steps: int) -> tuple[float, str, str]:
    """(joules per iteration, source, notes)."""
    readings = [p.energy_j for p in payloads]
    if all(e is not None for e in readings):
        return sum(e for e in readings if e is not None) / n_steps, "nvml", "sum over GPUs of NVML total-energy deltas"
    power = spec or get_device("cpu")
    per_host: dict[str, list[RankPayload]] = defaultdict(list)
    for p in payloads:
        per_host[p.host].append(p)
    total = 0.0
    for ranks in per_host.values():
        if ranks[0].memory_source == "cuda_allocator":  # GPUs without counters: busy power while computing
            busy = [sum(a.end_s - a.start_s for a in r.spans.actions) / max(1, len(r.spans.steps)) for r in ranks]
            total += sum(power.idle_power_W * iteration_s + (power.max_power_W - power.idle_power_W) * min(b, iteration_s)
                         for b in busy)
            continue
        util = min(1.0, sum(r.cpu_per_step for r in ranks) / (iteration_s * ranks[0].cpu_count))
        total += (power.idle_power_W + (power.max_power_W - power.idle_power_W) * util) * iteration_s
    notes = (f"estimated from the catalog's {power.name} power (idle {power.idle_power_W} W, max {power.max_power_W} W) "
             "scaled by the measured utilisation (CPU time over wall time × cores; busy compute time on GPUs)")
    return total, "estimated", notes


def _step_records(cfg: RunConfig, payloads: list[RankPayload]) -> list[StepRecord]:
    """One record per step: the slowest rank's wall time, the loss averaged over the last stage's ranks."""
    plan = cfg.plan
    loss_ranks = [p for p in payloads if plan.num_stages - 1 in p.stages and p.coords.tp == 0]
    steps_by_rank = [{s.step: s.end_s - s.start_s for s in p.spans.steps} for p in payloads]
    tokens = plan.global_batch_size * cfg.model.seq_len
    records = []
    for k, step in enumerate(sorted(steps_by_rank[0])):
        it = max(d[step] for d in steps_by_rank)
        loss = statistics.fmean(v for p in loss_ranks if (v := p.losses[k]) is not None)
        records.append(StepRecord(step=step, loss=loss, iteration_s=it, tokens_per_s=tokens / it if it else 0.0))
    return records


def _rank_record(p: RankPayload, n_steps: int) -> RankRecord:
    """A rank's per-step means over the measured steps."""
    first = p.first_measured

    def per_step(spans: list[Any], kind: str | None = None) -> float:
        return sum(x.end_s - x.start_s for x in spans if x.step >= first and (kind is None or x.kind == kind)) / n_steps

    return RankRecord(
        rank=p.rank, pp_rank=p.coords.pp, dp_rank=p.coords.dp, tp_rank=p.coords.tp, cp_rank=p.coords.cp, stages=p.stages, host=p.host,
        compute_s=per_step(p.spans.actions), p2p_wait_s=per_step(p.spans.comms, "p2p_wait"),
        dp_sync_s=per_step(p.spans.comms, "dp_sync"), optimizer_s=per_step(p.spans.optimizer),
        peak_memory_bytes=p.peak_memory_bytes, memory_source=p.memory_source, cpu_time_s=p.cpu_per_step,
        energy_j=None if p.energy_j is None else p.energy_j / n_steps, memory=p.memory,
    )


def _measurement(cfg: RunConfig, pre: Precheck, payloads: list[RankPayload], backend: str, device: torch.device,
                 spec: DeviceSpec | None, timeline_file: str | None) -> Measurement:
    plan, model = cfg.plan, cfg.model
    records = _step_records(cfg, payloads)
    first_measured = payloads[0].first_measured
    warmup = first_measured - payloads[0].first_step
    comms = [CommEvent(p.rank, c.step, c.kind, c.axis, c.op, c.start_s, c.end_s - c.start_s, c.size_bytes, c.group_size)
             for p in payloads for c in p.spans.comms]
    measured = measured_steps(records, warmup)
    n_steps = len(measured)
    # Energy adds up over every measured step; the headline time is the median of the clean ones.
    mean_s = statistics.fmean(r.iteration_s for r in measured)
    iteration_s = typical_iteration_s(records, warmup, comms)
    flops = model_flops_per_iteration(model, plan.global_batch_size, model.seq_len)
    hosts = len({p.host for p in payloads})
    devices = plan.world_size if device.type == "cuda" else hosts
    # A CPU entry measured on another CPU says nothing of this host's peak (0: MFU not computed).
    peak = spec.peak_flops(plan.precision) if spec is not None and describes_this_host(spec) else 0.0
    energy, energy_source, energy_notes = _energy(payloads, spec, mean_s, n_steps)
    clock_notes = sorted({p.clock_note for p in payloads if p.clock_note})
    if clock_notes:
        energy_notes = "; ".join([energy_notes, *clock_notes])
    actions = [ActionRecord(p.rank, a.step, a.stage, a.microbatch, a.kind, a.start_s, a.end_s - a.start_s, a.cpu_s,
                            a.memory_bytes)
               for p in payloads for a in p.spans.actions]
    optimizer = [OptimizerRecord(p.rank, o.step, o.start_s, o.end_s - o.start_s) for p in payloads
                 for o in p.spans.optimizer]
    # What-if knobs are recorded as what ran: torch.distributed.pipelining reduces a stage's
    # gradients after its last backward (perform_reduce_grad), so they were not overlapped, and
    # every stream ran at torch's default priority (no pipeline-first policy).
    ran = plan.as_executed()
    return Measurement(
        plan=ran, world_size=plan.world_size, nodes=hosts, backend=backend, device_kind=device.type,
        device_name=spec.name if spec is not None else torch.cuda.get_device_name(device),
        threads_per_rank=payloads[0].threads, torch_version=torch.__version__, schedule_source=pre.schedule_source,
        seed=cfg.seed, data=cfg.data, warmup_steps=warmup, steps=records,
        tokens_per_s=plan.global_batch_size * model.seq_len / iteration_s if iteration_s else 0.0,
        model_flops_per_iteration=flops, peak_flops_per_s=peak, devices_for_mfu=devices,
        mfu=flops / (iteration_s * peak * devices) if iteration_s and peak else 0.0,
        energy_j_per_iteration=energy, energy_source=energy_source, energy_notes=energy_notes, layer_times=LAYER_TIMES,
        actions=actions, comms=comms, ranks=[_rank_record(p, n_steps) for p in payloads], optimizer=optimizer,
        timeline_file=timeline_file,
        cpus_per_node=payloads[0].cpu_count, gradient_noise=payloads[0].noise,
    )


def build_trace(cfg: RunConfig, pre: Precheck, payloads: list[RankPayload], backend: str, device: torch.device,
                spec: DeviceSpec | None, command: str = "", timeline_file: str | None = None) -> Trace:
    """The measured trace of a run from every rank's payload."""
    plan, model = cfg.plan, cfg.model
    payloads = sorted(payloads, key=lambda p: p.rank)
    measurement = _measurement(cfg, pre, payloads, backend, device, spec, timeline_file)
    table = layer_table(payloads, fused_head=plan.fused_head_loss)
    notes = [f"measured with mindpipe run: {plan.world_size} ranks, schedule {plan.schedule} ({pre.schedule_source})"]
    if plan.recompute != "none" or plan.layer_memory_policy:
        notes.append(f"recompute={plan.recompute}: backward times include the recomputed forward")
    if plan.tp > 1:
        notes.append("times include tensor-parallel communication")
    for key in what_if_used(plan):
        notes.append(f"{key}={plan_value(getattr(plan, key))} is a what-if knob the executor does not carry out: "
                     f"the measurement's plan says what ran, {key}={plan_value(WHAT_IF_KEYS[key])}")
    notes += table.notes
    return Trace(
        device=measurement.device_name, dtype=plan.precision, layers=table.records,
        provenance=Provenance(tool="mindpipe run", command=command, date=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                              torch_version=torch.__version__, host=payloads[0].host, notes="; ".join(notes)),
        model=model, model_name=model.name, micro_batch_size=plan.micro_batch_size, seq_len=model.seq_len, tp=plan.tp,
        sequence_parallel=plan.sequence_parallel, flash_attention=plan.flash_attention, granularity="layer",
        backward_split="measured" if table.split else "combined", measurement=measurement,
    )


def write_outputs(cfg: RunConfig, pre: Precheck, payloads: list[RankPayload], backend: str, device: torch.device,
                  spec: DeviceSpec | None, command: str = "") -> Trace:
    """Write ``cfg.out`` (measured trace) and the timeline; returns the trace."""
    timeline = cfg.timeline_path
    trace = build_trace(cfg, pre, payloads, backend, device, spec, command,
                        timeline_file=Path(timeline).name if timeline else None)
    if cfg.out:
        trace.save(cfg.out)
    if timeline:
        write_chrome_trace(_timeline(payloads), timeline, label="measured")
    return trace


__all__ = ["build_trace", "write_outputs"]
