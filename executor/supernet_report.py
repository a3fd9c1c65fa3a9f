"""The measured trace of a supernet run (rank 0): every subnet's loss, stage times, resident bytes.

The file is the measured-run contract (:class:`~mindpipe.traces.measured.Measurement`) with its
supernet fields: ``subnets`` (id, choices, loss, in subnet order), ``subnet_stages`` (per rank:
compute, stall = blocked in receives, update, resident bytes) and ``subnets_per_hour`` (subnets
over the run's wall time: the slowest rank's, from the barrier before the first subnet). ``steps``
holds one record per subnet, its ``iteration_s`` the time between its completion and the previous
subnet's on the first stage (they sum to that stage's wall time). The trace's layer records are per
pipeline stage (``stage.<s>``: median F and whole-B time per subnet), since a run times stage
actions, not candidates (``mindpipe profile`` does that). Energy is estimated as for GPT runs
(:func:`mindpipe.executor.report._energy` is not reused: it reads GPT payloads), from the catalog's
power and the ranks' measured CPU time; the notes say so.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections import defaultdict

import torch
from mindpipe.executor.precheck import catalog_device
from mindpipe.executor.supernet_config import SupernetRunConfig
from mindpipe.executor.supernet_stage import combine_losses
from mindpipe.executor.supernet_worker import SupernetPayload
from mindpipe.traces.measured import (
    ActionRecord,
    CommEvent,
    Measurement,
    OptimizerRecord,
    RankRecord,
    StepRecord,
    SubnetRecord,
    SubnetStageRecord,
)
from mindpipe.traces.supernet import sample_subnet
from mindpipe.traces.trace import LayerRecord, Provenance, Trace


def _subnets(cfg: SupernetRunConfig, payloads: list[SupernetPayload]) -> list[SubnetRecord]:
    last = sorted((p for p in payloads if p.coords.pp == cfg.plan.pp - 1), key=lambda p: p.coords.dp)
    ids = sorted(last[0].losses)
    return [SubnetRecord(i, list(sample_subnet(cfg.supernet, i)), combine_losses([p.losses[i] for p in last]))
            for i in ids]


def _steps(cfg: SupernetRunConfig, payloads: list[SupernetPayload], subnets: list[SubnetRecord]) -> list[StepRecord]:
    """One record per subnet: time between successive completions of its last backward on stage 0."""
    first = next(p for p in payloads if p.coords.pp == 0 and p.coords.dp == 0)
    done = {a.microbatch: a.end_s for a in first.spans.actions if a.kind == "B"}
    tokens = cfg.plan.global_batch_size * cfg.supernet.seq_len
    out, prev = [], 0.0
    for sub in subnets:
        end = max(done[sub.id], prev + 1e-9)
        it = end - prev
        out.append(StepRecord(step=sub.id + 1, loss=sub.loss, iteration_s=it, tokens_per_s=tokens / it))
        prev = end
    return out


def _stage_record(p: SupernetPayload, switching: bool) -> SubnetStageRecord:
    comms = p.spans.comms
    return SubnetStageRecord(
        rank=p.rank, stage=p.coords.pp, dp_rank=p.coords.dp,
        compute_s=sum(a.end_s - a.start_s for a in p.spans.actions),
        stall_s=sum(c.end_s - c.start_s for c in comms if c.kind == "p2p_wait"),
        update_s=sum(c.end_s - c.start_s for c in comms if c.kind == "dp_sync") +
        sum(o.end_s - o.start_s for o in p.spans.optimizer),
        param_bytes=p.param_bytes, resident_param_bytes=p.resident_param_bytes,
        resident_state_bytes=p.resident_state_bytes, context_switch=switching)


def _layers(payloads: list[SupernetPayload], pp: int) -> list[LayerRecord]:
    out = []
    for s in range(pp):
        acts = [a for p in payloads if p.coords.pp == s for a in p.spans.actions]
        f = [a.end_s - a.start_s for a in acts if a.kind == "F"]
        b = [a.end_s - a.start_s for a in acts if a.kind == "B"]
        out.append(LayerRecord(name=f"stage.{s}", kind="pipeline_stage", forward_s=statistics.median(f),
                               backward_input_s=statistics.median(b), backward_weight_s=0.0))
    return out


def build_trace(cfg: SupernetRunConfig, payloads: list[SupernetPayload], backend: str, device: torch.device,
                command: str = "") -> Trace:
    """The measured trace of a supernet run from every rank's payload."""
    plan, net = cfg.plan, cfg.supernet
    payloads = sorted(payloads, key=lambda p: p.rank)
    subnets = _subnets(cfg, payloads)
    steps = _steps(cfg, payloads, subnets)
    wall = max(p.end_s for p in payloads)
    spec = catalog_device(device.type, torch.cuda.get_device_name(device) if device.type == "cuda" else None)
    hosts: dict[str, list[SupernetPayload]] = defaultdict(list)
    for p in payloads:
        hosts[p.host].append(p)
    energy, notes = 0.0, "not estimated: the GPU is not in the catalog"
    power = spec
    if power is not None:
        for host_ranks in hosts.values():
            util = min(1.0, sum(r.cpu_s for r in host_ranks) / (wall * host_ranks[0].cpu_count)) \
                if device.type == "cpu" else \
                min(1.0, statistics.fmean(sum(a.end_s - a.start_s for a in r.spans.actions) for r in host_ranks) / wall)
            energy += (power.idle_power_W + (power.max_power_W - power.idle_power_W) * util) * wall
        notes = (f"estimated from the catalog's {power.name} power (idle {power.idle_power_W} W, max "
                 f"{power.max_power_W} W) scaled by the measured utilisation over the whole run")
    n = len(subnets)
    actions = [ActionRecord(p.rank, a.step, a.stage, a.microbatch, a.kind, a.start_s, a.end_s - a.start_s, a.cpu_s)
               for p in payloads for a in p.spans.actions]
    comms = [CommEvent(p.rank, c.step, c.kind, c.axis, c.op, c.start_s, c.end_s - c.start_s, c.size_bytes, c.group_size)
             for p in payloads for c in p.spans.comms]
    ranks = [RankRecord(rank=p.rank, pp_rank=p.coords.pp, dp_rank=p.coords.dp, tp_rank=0, stages=[p.coords.pp],
                        host=p.host, compute_s=(r := _stage_record(p, cfg.switching)).compute_s / n,
                        p2p_wait_s=r.stall_s / n, dp_sync_s=sum(c.end_s - c.start_s for c in p.spans.comms
                                                                if c.kind == "dp_sync") / n,
                        optimizer_s=sum(o.end_s - o.start_s for o in p.spans.optimizer) / n,
                        peak_memory_bytes=p.peak_memory_bytes, memory_source=p.memory_source,
                        cpu_time_s=p.cpu_s / n) for p in payloads]
    measurement = Measurement(
        plan=plan, world_size=plan.world_size, nodes=len(hosts), backend=backend, device_kind=device.type,
        device_name=spec.name if spec is not None else torch.cuda.get_device_name(device),
        threads_per_rank=payloads[0].threads, torch_version=torch.__version__, schedule_source="simulator",
        seed=cfg.seed, data="synthetic", warmup_steps=0, steps=steps,
        tokens_per_s=n * plan.global_batch_size * net.seq_len / wall, model_flops_per_iteration=0.0,
        peak_flops_per_s=0.0, devices_for_mfu=plan.world_size if device.type == "cuda" else len(hosts), mfu=0.0,
        energy_j_per_iteration=energy / n, energy_source="estimated", energy_notes=notes,
        layer_times="median F and whole-B action time per pipeline stage", actions=actions, comms=comms, ranks=ranks,
        optimizer=[OptimizerRecord(p.rank, o.step, o.start_s, o.end_s - o.start_s) for p in payloads
                   for o in p.spans.optimizer], cpus_per_node=payloads[0].cpu_count, subnets=subnets,
        subnet_stages=[_stage_record(p, cfg.switching) for p in payloads], subnets_per_hour=3600.0 * n / wall,
        subnet_schedule=cfg.schedule, subnet_segments=payloads[0].segments)
    note = (f"measured with mindpipe run: supernet {net.label}, {plan.world_size} ranks (dp={plan.dp}, pp={plan.pp}), "
            f"subnet_schedule {cfg.schedule}, context switching {'on' if cfg.switching else 'off'}; MFU not computed "
            "for supernets (model_flops 0)")
    return Trace(device=measurement.device_name, dtype="fp32", layers=_layers(payloads, plan.pp),
                 provenance=Provenance(tool="mindpipe run", command=command,
                                       date=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                                       torch_version=torch.__version__, host=payloads[0].host, notes=note),
                 model_name=net.label, micro_batch_size=plan.micro_batch_size, seq_len=net.seq_len,
                 backward_split="combined", measurement=measurement, supernet=net)


__all__ = ["build_trace"]
