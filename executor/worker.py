"""One rank of a run: build the parallel model from the plan, train, measure, checkpoint.

Apply order (torchtitan): the GPT is built whole with the run's seed (identical weights on every
rank), cut into this pipeline rank's stages, and each stage gets TP → recompute → DP
(:mod:`mindpipe.executor.parallelize`); each stage becomes a ``PipelineStage`` on the mesh's ``pp`` group
and the plan's schedule drives them (torch's class, or the simulator's action table). With
``pp = 1`` the same path runs a single stage, so gradient accumulation over micro-batches, loss
scaling and the data-parallel reduction are torch's in every case.

At the end every rank sends its measurements to rank 0 (``gather_object``), which writes the
measured trace and the timeline (:mod:`mindpipe.executor.report`).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from mindpipe.executor.clocks import ActionClocks, lock_stage_clock, start_action_clocks
from mindpipe.executor.comm_profile import profiled
from mindpipe.executor.config import RunConfig
from mindpipe.executor.data import TokenSource
from mindpipe.executor.distributed import build_mesh, coordinates, host_name, init_process_group, pick_device, rank_env
from mindpipe.executor.fp8 import convert_to_fp8
from mindpipe.executor.measure import EnergyMeter, Recorder, cpu_seconds, peak_memory, stage_memory
from mindpipe.executor.memory_account import MemoryAccount
from mindpipe.executor.noise_probe import NoiseProbe, noise_method
from mindpipe.executor.offload import HostPool, install_prefetch
from mindpipe.executor.parallelize import parallelize_stage
from mindpipe.executor.partial_grads import reduce_before_grad_sync, reduce_partial_grads
from mindpipe.executor.payload import Coords, RankPayload
from mindpipe.executor.pipeline import make_schedule, simulator_schedule
from mindpipe.executor.precheck import Precheck, catalog_device, check_run, ranks_per_host
from mindpipe.executor.rundir import ProgressReporter, record_error, record_finished, record_note
from mindpipe.executor.stages import build_stage_modules, permute_qkv_for_tp
from mindpipe.executor.tied_table import TiedTable
from mindpipe.executor.torch_pipelining import merge_weight_passes, timed_p2p_waits
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import block_policies, data_parallel_units, lazy_copy_back, one_weight_pass, stage_layout
from mindpipe.traces.noise_scale import NoiseEmaState
from mindpipe.traces.result import GIB
from mindpipe.traces.schema import to_dict
from mindpipe.traces.torch_context_parallel import ContextShard
from mindpipe.traces.torch_gpt import VocabShard
from mindpipe.traces.torch_models import build_model, use_context_parallel
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage

# Fault injection for the failure tests: "RANK:STEP[:raise|contract|exit|hang]" makes that rank raise
# (a RuntimeError, or an input error), die without a Python error, or stop responding at that step;
# "RANK:teardown" makes it abort (SIGABRT) after the run finished, as torch's teardown sometimes does.
FAULT_ENV = "MINDPIPE_FAULT"


def _fault(rank: int, step: int | None) -> None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    parts = spec.split(":")
    if parts[1] == "teardown":
        if step is None and int(parts[0]) == rank:
            os.abort()
        return
    if step is not None and int(parts[0]) == rank and int(parts[1]) == step:
        mode = parts[2] if len(parts) > 2 else "raise"
        if mode == "exit":
            os._exit(17)  # a hard crash: no Python exception, no cleanup
        if mode == "contract":
            raise ContractError(FAULT_ENV, None, f"injected input error on rank {rank} at step {step}")
        if mode == "hang":
            while True:  # peers must time out (init_process_group timeout), not wait forever
                time.sleep(3600)
        raise RuntimeError(f"injected fault on rank {rank} at step {step} ({FAULT_ENV}={spec})")


def run(cfg: RunConfig, command: str = "", pre: Precheck | None = None) -> int:
    """Run this rank to completion; rank 0 writes the outputs. Returns the exit status.

    ``pre`` is the result of :func:`mindpipe.executor.precheck.check_run` if the caller already ran it.
    """
    env = rank_env()
    device, backend = pick_device(cfg.device, env.local_rank)
    spec = catalog_device(device.type, torch.cuda.get_device_name(device) if device.type == "cuda" else None)
    if pre is None:
        pre = check_run(cfg.model, cfg.plan, env.world_size, device.type, spec, cfg.schedule_source,
                        text_data=cfg.data != "synthetic",
                        ranks_per_device=ranks_per_host() if device.type == "cpu" else 1)
    init_process_group(env, backend, device, cfg.timeout_s)
    try:
        payloads = _train(cfg, device, pre)
        if payloads is not None:  # rank 0
            from mindpipe.executor.report import write_outputs

            write_outputs(cfg, pre, payloads, backend=backend, device=device, spec=spec, command=command)
        dist.barrier()
        record_finished(env.rank)
        _fault(env.rank, None)
        return 0
    except BaseException as e:
        record_error(env.rank, e)
        raise
    finally:
        dist.destroy_process_group()


def _save(cfg: RunConfig, step: int, parts: list[Any], optimizers: list[Any], probe: NoiseProbe | None) -> None:
    from mindpipe.executor import checkpoint as ckpt  # DCP is imported only by runs that checkpoint

    state = None if probe is None else {"gradient_noise": probe.estimator.state().to_json()}
    ckpt.save(cfg.checkpoint_dir or ".", step, parts, optimizers, cfg.plan.tp, to_dict(cfg.model), state,
              cfg.keep_checkpoints)


def _resume(cfg: RunConfig, parts: list[Any], optimizers: list[Any], probe: NoiseProbe | None) -> int:
    """Load the checkpoint; a probe continues the noise scale's moving averages it kept. Returns its step."""
    from mindpipe.executor import checkpoint as ckpt

    start = ckpt.load(cfg.checkpoint_dir or ".", parts, optimizers, cfg.plan.tp, to_dict(cfg.model), step=cfg.resume_from)
    state = ckpt.run_state(cfg.checkpoint_dir or ".", start)
    if probe is None or state is None or state.get("gradient_noise") is None:
        return start
    try:
        saved = NoiseEmaState.from_json(state["gradient_noise"])
    except ContractError as e:
        raise ContractError(str(cfg.checkpoint_dir), "gradient_noise", e.rule) from None
    if (saved.method, saved.ema_beta) == (probe.estimator.result.method, probe.estimator.result.ema_beta):
        probe.estimator.restore(saved)
    elif dist.get_rank() == 0:  # another split of the same model (e.g. dp changed): the norms differ in kind
        note = (f"the checkpoint's noise-scale averages were taken with method {saved.method}; this plan measures "
                f"{probe.estimator.result.method}: the noise scale starts afresh")
        if not record_note(note):
            print(f"executor: note: {note}", file=sys.stderr, flush=True)
    return start


@dataclass
class _Rank:
    """What one rank builds from the plan before training: its stages, their wrappers, meters and optimizers."""

    mesh: DeviceMesh
    coords: dict[str, int]
    modules: dict[int, Any]  # stage index -> stage module
    memory: MemoryAccount
    pool: HostPool
    recorder: Recorder
    tied: TiedTable
    probe: NoiseProbe | None
    context: ContextShard | None
    schedule: Any
    orders: dict[int, list[str]]
    optimizers: list[torch.optim.AdamW]
    num_stages: int  # the plan's (pp × virtual stages)
    action_clocks: ActionClocks | None  # the plan's per-action SM clocks, switched around each action

    @property
    def parts(self) -> list[Any]:
        """The stage modules in stage order."""
        return [mod for _, mod in sorted(self.modules.items())]

    @property
    def has_first(self) -> bool:
        """Whether this rank holds the first stage (it feeds the tokens)."""
        return 0 in self.modules

    @property
    def has_last(self) -> bool:
        """Whether this rank holds the last stage (it computes the loss)."""
        return self.num_stages - 1 in self.modules


@dataclass
class _Measured:
    """What the training loop measured on one rank (the aggregates leave out the warm-up steps)."""

    losses: list[float | None]
    first_measured: int
    cpu_s: float
    cpu_steps: int
    energy_j: float | None


def _train(cfg: RunConfig, device: torch.device, pre: Precheck) -> list[RankPayload] | None:
    """Build, resume if asked, train ``cfg.steps`` steps and gather every rank's payload on rank 0."""
    rank = _build(cfg, device, pre)
    parts = rank.parts
    start = _resume(cfg, parts, rank.optimizers, rank.probe) if cfg.resume and cfg.checkpoint_dir else 0
    if start:  # the restored optimizer state is resident from the first step on, before any step re-reads it
        rank.memory.refresh_optimizer(rank.optimizers)
    if start >= cfg.steps:
        raise ContractError("--steps", None, f"the checkpoint is at step {start}; --steps {cfg.steps} leaves nothing to run")
    try:
        source = TokenSource(cfg.model, cfg.plan, cfg.seed, cfg.data)
    except ContractError:
        raise
    except ValueError as e:  # a --data file too short for one sample
        raise ContractError("--data", None, str(e)) from None
    clock = rank.action_clocks or lock_stage_clock(cfg.plan, device, rank.coords["pp"], verbose=dist.get_rank() == 0)
    measured = _loop(cfg, rank, source, start, device)
    clock.release()
    if cfg.checkpoint_dir:
        _save(cfg, cfg.steps, parts, rank.optimizers, rank.probe)
    mem, mem_source = peak_memory(device)
    payload = RankPayload(
        rank=dist.get_rank(), coords=Coords(**rank.coords), stages=sorted(rank.modules), host=host_name(),
        cpu_count=os.cpu_count() or 1, threads=torch.get_num_threads(), spans=rank.recorder.spans,
        layers=rank.recorder.layers.infos(), losses=measured.losses, first_step=start + 1,
        first_measured=measured.first_measured, cpu_s=measured.cpu_s, cpu_steps=measured.cpu_steps,
        energy_j=measured.energy_j, peak_memory_bytes=mem, memory_source=mem_source, orders=rank.orders,
        memory=stage_memory(device, rank.memory, rank.pool), clock_note=clock.note(rank.coords["pp"]),
        noise=rank.probe.result if rank.probe is not None else None,
    )
    gathered: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(payload, gathered, dst=0)
    return gathered


def _build(cfg: RunConfig, device: torch.device, pre: Precheck) -> _Rank:
    """This rank's stages of the plan: cut, parallelized, wrapped for measurement, scheduled, with optimizers."""
    plan, model = cfg.plan, cfg.model
    mesh = build_mesh(plan, device)
    coords = coordinates(mesh)
    gpt = build_model(model, seed=cfg.seed, dtype="fp32", flash_attention=plan.flash_attention)
    # Context parallelism: the rank's share of each sequence, attention over the cp group.
    context = ContextShard.of(mesh.get_group("cp"), plan.cp_comm_type) if plan.cp > 1 else None
    use_context_parallel(gpt, context)
    permute_qkv_for_tp(gpt, plan.tp)
    modules = build_stage_modules(gpt, plan, coords["pp"])
    del gpt  # blocks of other pipeline ranks are freed here
    parts = [mod for _, mod in sorted(modules.items())]
    budget = None if cfg.memory_budget_gib is None else int(cfg.memory_budget_gib * GIB)
    memory = MemoryAccount(parts, device, f"pipeline rank {coords['pp']} (stages {sorted(modules)})", budget)
    pool = HostPool(device)
    spans, policies = stage_layout(plan, model), block_policies(plan, model.num_layers)
    stages = []
    for s, mod in sorted(modules.items()):
        mod.to(device)
        if plan.precision == "fp8":  # Float8Linear before the data-parallel wrapper (torchao's order)
            convert_to_fp8(mod, device)
        parallelize_stage(mod, mesh, plan, model.num_layers, pool, memory)
        stages.append(PipelineStage(mod, s, plan.num_stages, device, group=mesh.get_group("pp")))
        if one_weight_pass(model, spans[s], policies):  # acts only on a split backward's I and W
            merge_weight_passes(stages[-1])
    memory.count_weights()
    tied = TiedTable(plan, model, mesh, modules)  # after the wrappers: their parameters are the ones stepped
    if data_parallel_units(plan, 1):  # FSDP2's fully_shard or replicate: both gather into buffers of their own
        memory.watch_gathered()
    recorder = Recorder(device, origin=0.0)
    for st, mod in zip(stages, parts, strict=True):
        memory.watch_kept_gradients(st)
        recorder.wrap_stage(st, mod.layers())
        memory.wrap_stage(st)
        recorder.memory = memory
    # Outside the timed actions: the gradient norms of the noise scale (mindpipe.executor.noise_probe).
    method = noise_method(plan, model)
    probe = NoiseProbe(plan, device, method) if method is not None else None
    if probe is not None:
        for st, mod in zip(stages, parts, strict=True):
            probe.wrap_stage(st, mod)
    for st, mod in zip(stages, parts, strict=True):  # wraps the others: runs first
        reduce_before_grad_sync(st, mod)
    # Perseus's per-action clocks (mindpipe.executor.clocks): a switch queued as each action starts.
    action_clocks = start_action_clocks(plan, device, stages, verbose=dist.get_rank() == 0)
    # Under tensor parallelism the LM head's logits stay vocabulary-parallel (executor/parallelize.py).
    shard = VocabShard.of(model.vocab_size, mesh.get_group("tp")) if plan.tp > 1 else None
    for mod in parts:  # a fused head's loss runs in the last stage's forward: count its backward there
        if mod.head_loss is not None:
            mod.head_loss = memory.counting_loss(mod.head_loss, with_weights=True)
    schedule, orders = make_schedule(plan, stages, pre.schedule_source, memory.counting_loss, shard)
    swapped = {s for s in modules if any(policies[b] == "swap" for b in spans[s].blocks)}
    if swapped:  # vPipe's prefetch of swapped activations, in the order the simulator times
        install_prefetch(stages, pool, simulator_schedule(plan).orders[coords["pp"]], swapped, memory.transient,
                         lazy_copy_back(plan))
    try:
        # On CUDA torch's fused AdamW: one multi-tensor kernel over the parameters' state, as Megatron's
        # FusedAdam and torchtitan's default, and what the simulator prices (GpuComputeModel's
        # optimizer_step_s). torch's default there (foreach) took 21.3 ms per step for a 1.08B-parameter
        # stage on an H200 (benchmarks/results/gpu-h200), against 12.8 ms priced.
        fused = True if device.type == "cuda" else None
        optimizers = [torch.optim.AdamW(p.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused)
                      for p in parts]
    except ValueError as e:  # torch's own check of the hyper-parameters (e.g. a NaN learning rate)
        raise ContractError("--lr/--weight-decay", None, str(e)) from None
    return _Rank(mesh=mesh, coords=coords, modules=modules, memory=memory, pool=pool, recorder=recorder, tied=tied,
                 probe=probe, context=context, schedule=schedule, orders=orders, optimizers=optimizers,
                 num_stages=plan.num_stages, action_clocks=action_clocks)


def _loop(cfg: RunConfig, rank: _Rank, source: TokenSource, start: int, device: torch.device) -> _Measured:
    """Train steps ``start + 1 .. cfg.steps``: one schedule step, the tied tables' sum and the optimizers each."""
    plan, coords, probe = cfg.plan, rank.coords, rank.probe
    energy = EnergyMeter(device)
    # Aggregates leave out the warm-up steps, unless that would leave nothing (the launcher says so).
    first_measured = start + 1 + cfg.warmup_steps if cfg.steps - start > cfg.warmup_steps else start + 1
    losses: list[torch.Tensor | None] = []
    marks: dict[str, Any] = {}
    # The profiled step's CPU time (torch.profiler's own work inflates it) is left out of cpu_s,
    # unless it is the only measured step.
    skip_profiled_cpu = first_measured <= cfg.profile_step <= cfg.steps and cfg.steps > first_measured
    profiled_cpu = 0.0
    # One rank shows how far the run is: the first replica's holder of the loss.
    reports = rank.has_last and all(v == 0 for k, v in coords.items() if k != "pp")
    progress = ProgressReporter(cfg.steps, plan.dp * plan.cp) if reports else None
    dist.barrier()
    rank.recorder.origin = time.perf_counter()  # the run's time origin (see traces.measured)
    for step in range(start + 1, cfg.steps + 1):
        began = time.perf_counter()
        _fault(dist.get_rank(), step)
        if step == first_measured:
            marks = {"cpu": cpu_seconds(), "energy": energy.read()}
        torch.manual_seed(cfg.seed * 7919 + step)  # dropout streams depend on the step only
        x, y = _batch_at(rank, source, step, device)
        mb_losses, step_cpu = _train_step(cfg, rank, x, y, step, skip_profiled_cpu and step == cfg.profile_step)
        if step_cpu is not None:
            profiled_cpu = step_cpu
        loss = torch.stack(mb_losses).mean().detach() if rank.has_last else None
        losses.append(loss)
        if progress is not None and loss is not None:
            progress.after(step, loss.item, time.perf_counter() - began)
        if cfg.checkpoint_dir and cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < cfg.steps:
            _save(cfg, step, rank.parts, rank.optimizers, probe)
    cpu_s = cpu_seconds() - marks["cpu"] - profiled_cpu
    e1 = energy.read()
    return _Measured(
        losses=[None if v is None else float(v) for v in losses], first_measured=first_measured, cpu_s=cpu_s,
        cpu_steps=cfg.steps - first_measured + 1 - int(skip_profiled_cpu),
        energy_j=(e1 - marks["energy"]) if e1 is not None and marks["energy"] is not None else None,
    )


def _batch_at(rank: _Rank, source: TokenSource, step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's inputs and targets of ``step`` (its share of the sequence under context parallelism), on ``device``."""
    x, y = source.local_batch_at(step, rank.coords["dp"])
    if rank.context is not None:
        x, y = rank.context.take(x), rank.context.take(y)
    return x.to(device), y.to(device)


def _train_step(cfg: RunConfig, rank: _Rank, x: torch.Tensor, y: torch.Tensor, step: int,
                time_cpu: bool) -> tuple[list[torch.Tensor], float | None]:
    """One training step on ``x``, ``y``: the schedule, the tied tables' sum and the optimizers, recorded.

    Returns the last stage's micro-batch losses (none on other ranks) and, when ``time_cpu``, the
    step's CPU seconds (else None).
    """
    memory, recorder, has_last = rank.memory, rank.recorder, rank.has_last
    for opt in rank.optimizers:
        opt.zero_grad(set_to_none=True)
    memory.refresh_gradients()
    mb_losses: list[torch.Tensor] = []
    args = (x,) if rank.has_first else ()
    kwargs: dict[str, Any] = {"target": y, "losses": mb_losses} if has_last else {}
    if has_last and cfg.plan.fused_head_loss:  # the last stage's forward computes the loss
        kwargs["targets"] = y
    recorder.begin_step(step)
    cpu0 = cpu_seconds() if time_cpu else None
    with profiled(step == cfg.profile_step, recorder, rank.mesh), timed_p2p_waits(recorder.p2p_wait):
        with memory.saving(step):
            rank.schedule.step(*args, return_outputs=False, **kwargs)
        reduce_partial_grads(rank.parts)  # left by a schedule without perform_reduce_grad (executor/partial_grads.py)
        rank.tied.sum_gradients()  # a tied head's two tables (mindpipe.traces.layout.tied_table_ranks)
        with recorder.optimizer_span():
            for opt in rank.optimizers:
                opt.step()
        memory.refresh_optimizer(rank.optimizers)
    recorder.end_step()
    if rank.probe is not None:
        rank.probe.end_step(step)
    return mb_losses, (cpu_seconds() - cpu0 if cpu0 is not None else None)


__all__ = ["FAULT_ENV", "run"]
