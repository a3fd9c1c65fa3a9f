"""One rank of a supernet run: build its stage, train subnet segments with the plan's schedule, report.

The rank sits at (pp stage s, dp replica r) of the plan's mesh (:mod:`mindpipe.executor.distributed`).
It builds only stage s's candidates (seeded per candidate, so they equal a single-process build's),
and trains subnets in segments of ``--checkpoint-every`` (all of them when 0): for each segment it
samples the subnets (:func:`~mindpipe.traces.supernet.sample_subnet`), asks
:func:`~mindpipe.traces.supernet.subnet_stage_operators` what each uses per stage, builds the
segment's table with :func:`~mindpipe.simulator.subnet_schedules.build_subnet_schedule` (checked with
:func:`~mindpipe.simulator.subnet_schedules.csp_violations` before a csp run), runs its own order
(:class:`~mindpipe.executor.supernet_stage.StageRunner`), drains, records the segment's partition and
measured stage times, with ``--repartition`` may move layers between stages
(:mod:`~mindpipe.executor.supernet_repartition`; the next segment's table is built for the new
partition), and checkpoints. Subnet i's batch
comes from the stream (seed, i); replica r takes its rows. At the end every rank sends its payload
to rank 0, which writes ``measured.json`` (:mod:`mindpipe.executor.supernet_report`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from mindpipe.executor import supernet_checkpoint as ckpt
from mindpipe.executor.distributed import build_mesh, coordinates, host_name, init_process_group, pick_device, rank_env
from mindpipe.executor.measure import cpu_seconds, peak_memory
from mindpipe.executor.payload import Coords, Spans
from mindpipe.executor.rundir import ProgressReporter, record_error, record_finished
from mindpipe.executor.supernet_config import SupernetRunConfig, resume_model_document
from mindpipe.executor.supernet_repartition import exchange, next_partition, segment_compute_s
from mindpipe.executor.supernet_stage import StageLinks, StageRunner, make_optimizer
from mindpipe.executor.supernet_switch import ContextSwitcher
from mindpipe.executor.worker import _fault
from mindpipe.simulator.subnet_schedules import build_subnet_schedule, csp_violations
from mindpipe.traces.errors import ContractError
from mindpipe.traces.measured import SubnetSegment
from mindpipe.traces.result import GIB
from mindpipe.traces.schema import to_dict
from mindpipe.traces.supernet import sample_subnets, subnet_stage_operators, supernet_stage_layers
from mindpipe.traces.torch_supernet import SupernetStage, synthetic_tokens


@dataclass
class SupernetPayload:
    """One rank's measurements of a supernet run, gathered to rank 0.

    Attributes:
        rank, coords, host, cpu_count, threads: Who.
        spans: Compute actions (step = subnet id + 1), p2p waits, dp syncs, optimizer steps.
        losses: Subnet id → this replica's loss (last stage only).
        first_subnet: First subnet this launch trained.
        end_s: When the rank finished its last action (seconds since the origin).
        cpu_s: Process CPU seconds of the training loop.
        param_bytes: Every candidate and shared part of the stage (fp32 bytes).
        resident_param_bytes, resident_state_bytes: Peaks of resident parameters, and of
            parameters + gradients + optimizer state.
        budget_bytes: ``--memory-budget-gib`` in bytes, if given.
        peak_memory_bytes, memory_source: The process's peak as the GPT workers measure it
            (:func:`~mindpipe.executor.measure.peak_memory`: CUDA's allocator peak, or the peak
            resident set on a CPU), for the run record's ranks.
        orders: The stage's actions of the first segment (``1F3`` ...).
        segments: Every segment's partition and measured stage times (the same on every rank).
    """

    rank: int
    coords: Coords
    host: str
    cpu_count: int
    threads: int
    spans: Spans
    losses: dict[int, float]
    first_subnet: int
    end_s: float
    cpu_s: float
    param_bytes: int
    resident_param_bytes: int
    resident_state_bytes: int
    budget_bytes: int | None
    peak_memory_bytes: int
    memory_source: str
    orders: list[str]
    segments: list[SubnetSegment]


def run(cfg: SupernetRunConfig, command: str = "") -> int:
    """Run this rank to completion; rank 0 writes ``cfg.out``. Returns the exit status."""
    env = rank_env()
    device, backend = pick_device(cfg.device, env.local_rank)
    init_process_group(env, backend, device, cfg.timeout_s)
    try:
        payloads = _train(cfg, device)
        if payloads is not None and cfg.out:
            from mindpipe.executor.supernet_report import build_trace

            build_trace(cfg, payloads, backend, device, command).save(cfg.out)
        dist.barrier()
        record_finished(env.rank)
        return 0
    except BaseException as e:
        record_error(env.rank, e)
        raise
    finally:
        dist.destroy_process_group()


def _build(cfg: SupernetRunConfig, device: torch.device, stage: int, layers: list[int]) -> SupernetStage:
    """The stage of partition ``layers``, built on the host; on the device all of it, or (switching on a GPU) the shared parts.

    With switching the candidates go from the host straight into the switcher's pinned pool: a stage
    whose candidates do not fit on the device never has them all there.
    """
    module = SupernetStage(cfg.supernet, sum(layers[:stage]), layers[stage], stage == 0, stage == cfg.plan.pp - 1,
                           cfg.seed)
    if cfg.switching and device.type == "cuda":
        for shared in (module.embedding, module.head):
            if shared is not None:
                shared.to(device)
        return module
    return module.to(device)


def _switcher(cfg: SupernetRunConfig, module: SupernetStage, optimizer: torch.optim.Optimizer, device: torch.device,
              before: ContextSwitcher | None) -> ContextSwitcher:
    """The stage's context switcher (after a repartition: a new one over the new candidates, keeping the peaks)."""
    shared = [m for m in (module.embedding, module.head) if m is not None]
    out = ContextSwitcher(dict(module.candidates.items()), shared, optimizer, device, cfg.switching)
    if before is not None:
        out.peak_param_bytes = max(out.peak_param_bytes, before.peak_param_bytes)
        out.peak_state_bytes = max(out.peak_state_bytes, before.peak_state_bytes)
        out.total_param_bytes = max(out.total_param_bytes, before.total_param_bytes)
    return out


def _stage_times(mine: float, stage: int, dp_rank: int, pp: int, dp: int, device: torch.device) -> list[float]:
    """Per stage, the dp replicas' mean of their per-subnet compute (summed over all ranks: every rank gets the same)."""
    t = torch.zeros(pp * dp, dtype=torch.float64, device=device)
    t[stage * dp + dp_rank] = mine
    dist.all_reduce(t)
    c = t.cpu().tolist()
    return [sum(c[s * dp:(s + 1) * dp]) / dp for s in range(pp)]


@dataclass
class _Rank:
    """One rank's stage of the supernet and what trains it; a repartition replaces the optimizer,
    the switcher and the partition."""

    stage: int
    dp_rank: int
    module: SupernetStage
    optimizer: torch.optim.Optimizer
    switcher: ContextSwitcher
    partition: list[int]
    runner: StageRunner
    links: StageLinks
    spans: Spans
    pp_group: dist.ProcessGroup
    start: int  # subnets trained before this run (a resumed checkpoint's)
    model_doc: dict[str, Any]


def _train(cfg: SupernetRunConfig, device: torch.device) -> list[SupernetPayload] | None:
    """Set up this rank's stage, train the subnets segment by segment, gather every payload on rank 0."""
    rank = _setup(cfg, device)
    s, r, pp = rank.stage, rank.dp_rank, cfg.plan.pp
    budget = None if cfg.memory_budget_gib is None else int(cfg.memory_budget_gib * GIB)
    segments: list[SubnetSegment] = []
    orders: list[str] = []
    torch.manual_seed(cfg.seed)
    dist.barrier()
    origin = time.perf_counter()
    rank.runner.origin = rank.links.origin = origin
    cpu0 = cpu_seconds()
    if s == pp - 1 and r == 0:  # how far the run is, as each subnet's loss is known (at most once a second)
        progress = ProgressReporter(cfg.steps, cfg.plan.dp, unit="subnet")
        rank.runner.on_loss = lambda sid, loss: progress.after(
            sid + 1, lambda: loss, (time.perf_counter() - origin) / max(1, sid + 1 - rank.start))
    for first in range(rank.start, cfg.steps, cfg.segment):
        n = min(cfg.segment, cfg.steps - first)
        order = _segment(cfg, rank, first, n, device, segments)
        orders = orders or order
        if budget is not None and rank.switcher.peak_state_bytes > budget:
            raise RuntimeError(f"pipeline stage {s}: resident model state reached {rank.switcher.peak_state_bytes} "
                               f"bytes, over --memory-budget-gib {cfg.memory_budget_gib:g}")
        done = first + n
        new = next_partition(segments, cfg.repartition) if cfg.repartition and done < cfg.steps else None
        if new is not None:
            _repartition(cfg, rank, new, device)
        if cfg.checkpoint_dir and (done == cfg.steps or cfg.checkpoint_every):
            rank.switcher.restore_all()
            ckpt.save(cfg.checkpoint_dir, done, rank.module, rank.optimizer, s, r, rank.model_doc, rank.partition,
                      cfg.keep_checkpoints)
            rank.switcher.evict_all()
    end_s = time.perf_counter() - origin
    sw = rank.switcher
    mem, mem_source = peak_memory(device)
    payload = SupernetPayload(
        rank=dist.get_rank(), coords=Coords(pp=s, dp=r, tp=0), host=host_name(), cpu_count=os.cpu_count() or 1,
        threads=torch.get_num_threads(), spans=rank.spans, losses=rank.runner.losses, first_subnet=rank.start,
        end_s=end_s, cpu_s=cpu_seconds() - cpu0, param_bytes=sw.total_param_bytes,
        resident_param_bytes=sw.peak_param_bytes, resident_state_bytes=sw.peak_state_bytes,
        budget_bytes=budget, peak_memory_bytes=mem, memory_source=mem_source, orders=orders, segments=segments)
    gathered: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(payload, gathered, dst=0)
    return gathered


def _setup(cfg: SupernetRunConfig, device: torch.device) -> _Rank:
    """The rank's stage (from its checkpoint when resuming), optimizer, switcher, links and runner."""
    plan, net = cfg.plan, cfg.supernet
    mesh = build_mesh(plan, device)
    c = coordinates(mesh)
    s, r, pp, dp, mb = c["pp"], c["dp"], plan.pp, plan.dp, plan.micro_batch_size
    model_doc = to_dict(net)
    saved = (ckpt.read(cfg.checkpoint_dir, s, r, resume_model_document(cfg.checkpoint_dir, net))
             if cfg.resume and cfg.checkpoint_dir else None)
    partition = (saved is not None and ckpt.saved_partition(saved)) or supernet_stage_layers(plan, net)
    module = _build(cfg, device, s, partition)
    optimizer = make_optimizer([p for p in module.parameters() if p.requires_grad], cfg.lr, cfg.weight_decay)
    start = ckpt.load(saved, module, optimizer) if saved is not None else 0
    if start >= cfg.steps:
        raise ContractError("--steps", None, f"the checkpoint is after {start} subnets; --steps {cfg.steps} leaves nothing to run")
    switcher = _switcher(cfg, module, optimizer, device, None)
    pp_group = mesh.get_group("pp")
    prev = dist.get_global_rank(pp_group, s - 1) if s > 0 else None
    nxt = dist.get_global_rank(pp_group, s + 1) if s < pp - 1 else None
    dp_group = mesh.get_group("dp") if dp > 1 else None
    spans = Spans()
    links = StageLinks(prev, nxt, (mb, net.seq_len, net.hidden_size), device, spans, 0.0)

    def batch(sid: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = synthetic_tokens(net, cfg.seed, sid, mb * dp)[r * mb:(r + 1) * mb].to(device)
        return rows[:, :-1], rows[:, 1:]

    def all_reduce(flat: torch.Tensor) -> None:
        dist.all_reduce(flat, group=dp_group)

    runner = StageRunner(module, s, pp, dp, optimizer, switcher, links, batch, all_reduce if dp_group else None, spans, 0.0)
    return _Rank(stage=s, dp_rank=r, module=module, optimizer=optimizer, switcher=switcher, partition=list(partition),
                 runner=runner, links=links, spans=spans, pp_group=pp_group, start=start, model_doc=model_doc)


def _segment(cfg: SupernetRunConfig, rank: _Rank, first: int, n: int, device: torch.device,
             segments: list[SubnetSegment]) -> list[str]:
    """Train subnets ``first .. first + n - 1`` under the schedule; append their timing to ``segments``.

    Returns:
        This rank's actions of the segment (the run reports its first segment's).
    """
    plan, net, s, pp = cfg.plan, cfg.supernet, rank.stage, cfg.plan.pp
    _fault(dist.get_rank(), first + 1)
    choices = sample_subnets(net, n, first)
    seg_plan = dataclasses.replace(plan, partition=list(rank.partition))
    ops = [subnet_stage_operators(net, seg_plan, ch) for ch in choices]
    schedule = build_subnet_schedule(cfg.schedule, ops, pp, cfg.window, cfg.batch)
    if cfg.schedule == "csp" and (bad := csp_violations(schedule, ops)):
        raise RuntimeError(f"csp table of subnets {first}..{first + n - 1} breaks the rule: {bad[0]}")
    began = time.perf_counter()
    rank.runner.run(schedule, first, choices)
    wall = torch.tensor([(time.perf_counter() - began) / n], dtype=torch.float64, device=device)
    dist.all_reduce(wall, op=dist.ReduceOp.MAX)
    times = _stage_times(segment_compute_s(rank.spans, s, first, n), s, rank.dp_rank, pp, plan.dp, device)
    segments.append(SubnetSegment(first, list(rank.partition), times, float(wall.item())))
    return [f"{a.kind}{first + a.microbatch}" for a in schedule.orders[s]]


def _repartition(cfg: SupernetRunConfig, rank: _Rank, new: list[int], device: torch.device) -> None:
    """Move layers between stages to partition ``new``: their weights and optimizer state change ranks."""
    rank.switcher.restore_all()
    rank.optimizer = exchange(rank.module, rank.optimizer, rank.stage, rank.partition, new,
                              lambda t: dist.get_global_rank(rank.pp_group, t), device, cfg.lr, cfg.weight_decay)
    rank.switcher = _switcher(cfg, rank.module, rank.optimizer, device, rank.switcher)
    rank.runner.optimizer, rank.runner.switcher, rank.partition = rank.optimizer, rank.switcher, list(new)


__all__ = ["SupernetPayload", "run"]
