"""Turn the ranks' raw measurements into the measured trace and its timeline (rank 0).

The result is a :class:`mindpipe.traces.trace.Trace` with a :class:`mindpipe.traces.measured.Measurement`: the
simulator reads its per-layer records like any trace, calibration reads the raw timings.

Per-layer records: a pipeline stage is timed as a whole (one F, and B or I+W, per micro-batch),
so each stage's median time (measured steps, all micro-batches, all data/tensor-parallel replicas)
is spread over the stage's layers in proportion to their roofline cost on the catalog device
(:class:`mindpipe.simulator.costs.RooflineComputeModel`: FLOPs over peak, bytes over bandwidth), phase by
phase. Times include what ran inside the actions: TP collectives, FSDP gathers, and the forward
recompute of recomputed blocks (see ``provenance.notes``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from mindpipe.executor.config import RunConfig
from mindpipe.executor.precheck import Precheck
from mindpipe.executor.stages import block_ranges
from mindpipe.simulator.costs import RooflineComputeModel, boundary_bytes, layer_params
from mindpipe.simulator.ops import model_flops_per_iteration
from mindpipe.simulator.timeline import write_chrome_trace
from mindpipe.traces.catalog import DeviceSpec, get_device
from mindpipe.traces.measured import ActionRecord, CommEvent, Measurement, RankRecord, StepRecord
from mindpipe.traces.trace import LayerRecord, Provenance, Trace

LAYER_TIMES = ("stage medians spread over the stage's layers by roofline cost on the catalog device "
               "(FLOPs/peak vs bytes/bandwidth), per phase")
_CATEGORY = {"p2p_wait": "p2p", "dp_sync": "dp"}


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _stage_times(payloads: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Median F/B/I/W duration per stage over the measured steps and all replicas."""
    samples: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for p in payloads:
        for step, stage, _mb, kind, t0, t1, _cpu in p["spans"]["actions"]:
            if step >= p["first_measured"]:
                samples[stage][kind].append(t1 - t0)
    return {s: {k: _median(v) for k, v in kinds.items()} for s, kinds in samples.items()}


def layer_records(cfg: RunConfig, payloads: list[dict[str, Any]], spec: DeviceSpec) -> tuple[list[LayerRecord], bool]:
    """Per-layer records of the trace, and whether backward was split into I and W."""
    model, plan = cfg.model, cfg.plan
    costs = RooflineComputeModel(spec).layer_costs(model, plan)
    by_name = {c.name: c for c in costs}
    params = {name: n for name, _, n in layer_params(model, plan.tp)}
    out_bytes = boundary_bytes(model, plan)
    times = _stage_times(payloads)
    split = any("I" in t for t in times.values())
    records: list[LayerRecord] = []
    last = plan.num_stages - 1
    for s, (first, count) in enumerate(block_ranges(plan, model)):
        names = (["embedding"] if s == 0 else []) + [f"block.{i}" for i in range(first, first + count)]
        names += ["final_norm", "lm_head"] if s == last else []
        t = times.get(s, {})
        fwd = sum(by_name[n].forward_s for n in names) or 1.0
        bin_ = sum(by_name[n].backward_input_s for n in names) or 1.0
        bw = sum(by_name[n].backward_weight_s for n in names) or 1.0
        bfull = sum(by_name[n].backward_input_s + by_name[n].backward_weight_s for n in names) or 1.0
        for n in names:
            c = by_name[n]
            if split:
                i_s, w_s = t.get("I", 0.0) * c.backward_input_s / bin_, t.get("W", 0.0) * c.backward_weight_s / bw
            else:
                i_s, w_s = t.get("B", 0.0) * (c.backward_input_s + c.backward_weight_s) / bfull, 0.0
            records.append(LayerRecord(
                name=n, kind=c.kind, forward_s=t.get("F", 0.0) * c.forward_s / fwd, backward_input_s=i_s,
                backward_weight_s=w_s, output_bytes=out_bytes if c.kind != "lm_head" else 0, param_count=params[n],
            ))
    return records, split


def _timeline(payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for p in payloads:
        r = p["rank"]
        for step, stage, mb, kind, t0, t1, _cpu in p["spans"]["actions"]:
            events.append({"rank": r, "thread": "compute", "name": f"{kind}{mb} stage {stage}", "start_s": t0,
                           "end_s": t1, "category": kind, "step": step})
        for step, t0, t1 in p["spans"]["optimizer"]:
            events.append({"rank": r, "thread": "compute", "name": "optimizer", "start_s": t0, "end_s": t1,
                           "category": "optimizer", "step": step})
        for step, kind, axis, op, t0, t1, _size, _group in p["spans"]["comms"]:
            cat = _CATEGORY.get(kind, axis)
            events.append({"rank": r, "thread": "comm", "name": f"{op} ({axis})", "start_s": t0, "end_s": t1,
                           "category": cat, "step": step})
    return events


def _cpu_per_step(payload: dict[str, Any]) -> float:
    """A rank's CPU seconds per measured step, the profiled step left out (the profiler's own work)."""
    return float(payload["cpu_s"]) / payload["cpu_steps"]


def _energy(cfg: RunConfig, payloads: list[dict[str, Any]], spec: DeviceSpec | None, iteration_s: float,
            n_steps: int) -> tuple[float, str, str]:
    """(joules per iteration, source, notes)."""
    if payloads[0]["energy_j"] is not None and all(p["energy_j"] is not None for p in payloads):
        return sum(p["energy_j"] for p in payloads) / n_steps, "nvml", "sum over GPUs of NVML total-energy deltas"
    power = spec or get_device("cpu")
    per_host: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in payloads:
        per_host[p["host"]].append(p)
    total = 0.0
    for ranks in per_host.values():
        if ranks[0]["memory_source"] == "cuda_allocator":  # GPUs without counters: busy power while computing
            busy = [sum(t1 - t0 for *_, t0, t1, _cpu in r["spans"]["actions"]) / max(1, len(r["spans"]["steps"])) for r in ranks]
            total += sum(power.idle_power_W * iteration_s + (power.max_power_W - power.idle_power_W) * min(b, iteration_s)
                         for b in busy)
            continue
        util = min(1.0, sum(_cpu_per_step(r) for r in ranks) / (iteration_s * ranks[0]["cpu_count"]))
        total += (power.idle_power_W + (power.max_power_W - power.idle_power_W) * util) * iteration_s
    notes = (f"estimated from the catalog's {power.name} power (idle {power.idle_power_W} W, max {power.max_power_W} W) "
             "scaled by the measured utilisation (CPU time over wall time × cores; busy compute time on GPUs)")
    return total, "estimated", notes


def build_trace(cfg: RunConfig, pre: Precheck, payloads: list[dict[str, Any]], backend: str, device: torch.device,
                spec: DeviceSpec | None, command: str = "", timeline_file: str | None = None) -> Trace:
    """The measured trace of a run from every rank's payload (ordered by rank)."""
    plan, model = cfg.plan, cfg.model
    payloads = sorted(payloads, key=lambda p: p["rank"])
    last_stage = plan.num_stages - 1
    loss_ranks = [p for p in payloads if last_stage in p["stages"] and p["coords"]["tp"] == 0]
    steps_by_rank = [{s: t1 - t0 for s, t0, t1 in p["spans"]["steps"]} for p in payloads]
    first, tokens = payloads[0]["first_step"], plan.global_batch_size * model.seq_len
    records = []
    for k, step in enumerate(sorted(steps_by_rank[0])):
        it = max(d[step] for d in steps_by_rank)
        loss = statistics.fmean(p["losses"][k] for p in loss_ranks)
        records.append(StepRecord(step=step, loss=loss, iteration_s=it, tokens_per_s=tokens / it if it else 0.0))
    first_measured = payloads[0]["first_measured"]
    measured = [r for r in records if r.step >= first_measured]
    iteration_s = statistics.fmean(r.iteration_s for r in measured)
    n_steps = len(measured)
    flops = model_flops_per_iteration(model, plan.global_batch_size, model.seq_len)
    hosts = len({p["host"] for p in payloads})
    devices = plan.world_size if device.type == "cuda" else hosts
    peak = spec.peak_flops(plan.precision) if spec is not None else 0.0
    energy, energy_source, energy_notes = _energy(cfg, payloads, spec, iteration_s, n_steps)
    ranks, actions, comms = [], [], []
    for p in payloads:
        sp = p["spans"]
        per = [(s, t1 - t0) for s, *_, t0, t1, _cpu in sp["actions"] if s >= first_measured]

        def total(rows: list[Any], kind: str | None = None) -> float:
            return sum(r[5] - r[4] for r in rows if r[0] >= first_measured and (kind is None or r[1] == kind)) / n_steps

        ranks.append(RankRecord(
            rank=p["rank"], pp_rank=p["coords"]["pp"], dp_rank=p["coords"]["dp"], tp_rank=p["coords"]["tp"],
            stages=p["stages"], host=p["host"], compute_s=sum(d for _, d in per) / n_steps,
            p2p_wait_s=total(sp["comms"], "p2p_wait"), dp_sync_s=total(sp["comms"], "dp_sync"),
            optimizer_s=sum(t1 - t0 for s, t0, t1 in sp["optimizer"] if s >= first_measured) / n_steps,
            peak_memory_bytes=p["peak_memory"], memory_source=p["memory_source"], cpu_time_s=_cpu_per_step(p),
            energy_j=None if p["energy_j"] is None else p["energy_j"] / n_steps,
        ))
        actions += [ActionRecord(p["rank"], step, stage, mb, kind, t0, t1 - t0, cpu)
                    for step, stage, mb, kind, t0, t1, cpu in sp["actions"]]
        comms += [CommEvent(p["rank"], step, kind, axis, op, t0, t1 - t0, size, group)
                  for step, kind, axis, op, t0, t1, size, group in sp["comms"]]
    # torch.distributed.pipelining reduces a stage's gradients after its last backward
    # (perform_reduce_grad), so the run did not overlap them whatever the plan asked: record what ran.
    ran = dataclasses.replace(plan, overlap_grad_reduce=False) if plan.dp > 1 else plan
    measurement = Measurement(
        plan=ran, world_size=plan.world_size, nodes=hosts, backend=backend, device_kind=device.type,
        device_name=spec.name if spec is not None else torch.cuda.get_device_name(device),
        threads_per_rank=payloads[0]["threads"], torch_version=torch.__version__, schedule_source=pre.schedule_source,
        seed=cfg.seed, data=cfg.data, warmup_steps=first_measured - first, steps=records,
        tokens_per_s=tokens / iteration_s if iteration_s else 0.0, model_flops_per_iteration=flops,
        peak_flops_per_s=peak, devices_for_mfu=devices,
        mfu=flops / (iteration_s * peak * devices) if iteration_s and peak else 0.0,
        energy_j_per_iteration=energy, energy_source=energy_source, energy_notes=energy_notes, layer_times=LAYER_TIMES,
        actions=actions, comms=comms, ranks=ranks, timeline_file=timeline_file,
        cpus_per_node=payloads[0]["cpu_count"],
    )
    layers, split = layer_records(cfg, payloads, spec or get_device("cpu"))
    notes = [f"measured with mindpipe run: {plan.world_size} ranks, schedule {plan.schedule} ({pre.schedule_source})"]
    if plan.recompute != "none" or plan.layer_memory_policy:
        notes.append(f"recompute={plan.recompute}: backward times include the recomputed forward")
    if plan.tp > 1:
        notes.append("times include tensor-parallel communication")
    if plan.dp > 1 and plan.overlap_grad_reduce:
        notes.append("gradients were reduced after each stage's last backward (torch.distributed.pipelining), "
                     "not overlapped with it: the measurement's plan says overlap_grad_reduce=false")
    return Trace(
        device=measurement.device_name, dtype=plan.precision, layers=layers,
        provenance=Provenance(tool="mindpipe run", command=command, date=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                              torch_version=torch.__version__, host=payloads[0]["host"], notes="; ".join(notes)),
        model=model, model_name=model.name, micro_batch_size=plan.micro_batch_size, seq_len=model.seq_len, tp=plan.tp,
        sequence_parallel=plan.sequence_parallel, granularity="layer",
        backward_split="measured" if split else "combined", measurement=measurement,
    )


def write_outputs(cfg: RunConfig, pre: Precheck, payloads: list[dict[str, Any]], backend: str, device: torch.device,
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


__all__ = ["LAYER_TIMES", "build_trace", "layer_records", "write_outputs"]
