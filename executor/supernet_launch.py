"""``mindpipe run PLAN --model SUPERNET``: check a supernet run, then launch it like any other run.

The command line is ``mindpipe run``'s (:func:`~mindpipe.executor.config.add_run_arguments`);
``--steps`` counts subnets. Before any process starts: the plan against the supernet
(:func:`~mindpipe.traces.supernet.check_supernet_plan`), the world size, the model-state memory
budget (:func:`~mindpipe.executor.supernet_config.check_memory_budget`) and a resumed checkpoint's
trust checks. Then the ranks run under torchrun (:func:`~mindpipe.executor.launch.run_and_read`)
as :mod:`mindpipe.executor.supernet_worker`. This module imports torch only through the launcher
(which does not).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from mindpipe.executor.checkpoint_trust import check_resume, fresh_run_notes, repair_record
from mindpipe.executor.config import SMALL_MODEL_LR, plan_source
from mindpipe.executor.launch import reported, run_and_read
from mindpipe.executor.precheck import detect_device
from mindpipe.executor.supernet_config import SupernetRunConfig, check_memory_budget, resume_model_document
from mindpipe.traces.builtin import load_network, load_plan
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.measured import SubnetSegment
from mindpipe.traces.supernet import Supernet


def is_supernet_model(model_arg: str | None) -> bool:
    """Whether ``--model`` names a supernet (built-in, file or inline JSON); errors surface later."""
    if model_arg is None:
        return False
    try:
        return isinstance(load_network(model_arg), Supernet)
    except ContractError:
        return False


def supernet_config(args: argparse.Namespace) -> SupernetRunConfig:
    """Build and validate the run's config from ``mindpipe run``'s arguments.

    Raises:
        ContractError: a plan that does not suit the supernet, or an option the supernet executor
            does not take (``--data`` other than synthetic, ``--resume-from``).
    """
    net = load_network(args.model)
    if not isinstance(net, Supernet):
        raise ContractError("--model", None, f"{args.model} is not a supernet")
    plan = load_plan(args.plan)
    check_tuned_for(plan, net, plan_source(args.plan))
    for flag, value, default in (("--data", args.data, "synthetic"), ("--resume-from", args.resume_from, None)):
        if value != default:
            raise ContractError("command line", flag.lstrip("-").replace("-", "_"),
                                f"{flag} is not supported for supernet runs")
    try:
        return SupernetRunConfig(
            supernet=net, plan=plan, steps=args.steps, seed=args.seed,
            lr=SMALL_MODEL_LR if args.lr is None else args.lr, weight_decay=args.weight_decay,
            out=args.out, checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
            keep_checkpoints=getattr(args, "keep_checkpoints", 0),
            resume=args.resume, device=args.device, timeout_s=args.timeout, memory_budget_gib=args.memory_budget_gib,
            context_switch=getattr(args, "context_switch", "auto"), repartition=getattr(args, "repartition", None))
    except ContractError as e:
        # An option's own check names the command line (as a GPT run's does); the rest is the plan's.
        option = e.key in {f.name for f in dataclasses.fields(SupernetRunConfig)} - {"plan", "supernet"}
        raise ContractError("command line" if option else plan_source(args.plan), e.key, e.rule) from None


def check_tuned_for(plan: Plan, net: Supernet, source: str) -> None:
    """Refuse a tuned plan (``made_for.supernet``) run on another supernet, as a GPT plan's ``--model`` is.

    A tuned plan's partition and window were chosen for its supernet's layers and lists
    (``layer_candidates``: ``balanced`` splits on each layer's mean candidate cost); the label and
    the sampler seed (the subnets drawn, not their distribution) may differ.

    Raises:
        ContractError: ``plan.json: made_for: the plan was tuned for the supernet A …; --model gives B …``.
    """
    made = plan.made_for.supernet if plan.made_for is not None else None
    if made is None:
        return

    def key(n: Supernet) -> Supernet:
        return dataclasses.replace(n, name=None, sampler=dataclasses.replace(n.sampler, seed=0))

    if key(made) != key(net):
        differs = next((f.name for f in dataclasses.fields(Supernet)
                        if getattr(key(made), f.name) != getattr(key(net), f.name)), "supernet")
        raise ContractError(source, "made_for", f"the plan was tuned for the supernet {made.label}, --model gives "
                            f"{net.label}, whose {differs} differs (tune again for it, or give --model the supernet "
                            "the plan was tuned for)")


def precheck(cfg: SupernetRunConfig, world_size: int | None, source: str) -> None:
    """Everything refused before launch (see module docstring)."""
    if world_size is not None and world_size != cfg.plan.world_size:
        raise ContractError(source, "dp", f"dp×pp={cfg.plan.dp}×{cfg.plan.pp}={cfg.plan.world_size} ranks needed, "
                            f"the launch has {world_size}")
    check_memory_budget(cfg, source)
    if cfg.plan.precision != "fp32":  # the stages, the memory check and the measured trace are fp32 throughout
        print(f"mindpipe: note: the supernet executor trains in fp32; the plan's precision {cfg.plan.precision} is "
              "what the simulator and the tuner priced (fp32 weights and Adam state take more memory, and on a GPU "
              "run slower)", file=sys.stderr, flush=True)
    if cfg.checkpoint_dir and cfg.resume:
        for note in repair_record(cfg.checkpoint_dir):
            print(f"mindpipe: note: {note}", file=sys.stderr, flush=True)
        done = check_resume(cfg.checkpoint_dir, resume_model_document(cfg.checkpoint_dir, cfg.supernet), 1)
        if done >= cfg.steps:
            raise ContractError("--steps", None, f"the checkpoint is after {done} subnets; --steps {cfg.steps} "
                                "leaves nothing to run")
    elif cfg.checkpoint_dir:
        for note in fresh_run_notes(cfg.checkpoint_dir):
            print(f"mindpipe: note: {note}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class PartitionSpan:
    """A stretch of a supernet run trained with one partition: from subnet ``first``, at ``step_s``
    measured seconds per subnet (the mean of its segments'; None for files that predate it)."""

    first: int
    partition: list[int]
    step_s: float | None

    def text(self) -> str:
        """``[6, 6] from subnet 0 (0.0712 s/subnet)``."""
        timed = f" ({self.step_s:.3g} s/subnet)" if self.step_s is not None else ""
        return f"{self.partition} from subnet {self.first}{timed}"


def partition_history(segments: Sequence[SubnetSegment]) -> list[PartitionSpan]:
    """Each partition a run trained with, in order; a new one starts where a segment's partition
    differs from the one before (a repartition)."""
    out: list[PartitionSpan] = []
    for _, group in itertools.groupby(segments, key=lambda seg: tuple(seg.partition)):
        run = list(group)
        steps = [seg.step_s for seg in run if seg.step_s is not None]
        out.append(PartitionSpan(run[0].first, run[0].partition, sum(steps) / len(steps) if steps else None))
    return out


def _history_line(threshold: float, history: list[PartitionSpan]) -> str:
    """``repartition (threshold 1.1): 1 move: [6, 6] from subnet 0 (0.0712 s/subnet) -> [11, 1] from subnet 40 (...)``."""
    moved = max(len(history) - 1, 0)
    return (f"repartition (threshold {threshold:g}): {moved} move{'' if moved == 1 else 's'}: "
            + " -> ".join(h.text() for h in history))


def cmd_run_supernet(args: argparse.Namespace) -> int:
    """Check, launch and summarise a supernet run (``mindpipe run`` dispatches here for a supernet model)."""
    cfg = supernet_config(args)
    world = None if ":" in str(args.nnodes) else int(args.nproc) * int(args.nnodes)
    precheck(cfg, world, plan_source(args.plan))
    kind, _ = detect_device(cfg.device)
    started = time.perf_counter()
    trace, code = reported(lambda: run_and_read(cfg, args, kind, args.run_timeout, "subnet"))
    if trace is None:
        return code
    m = trace.measurement
    if m is None or m.subnets is None:
        raise ContractError(str(cfg.out), "measurement", "the run wrote no subnet records")
    print(f"mindpipe: wrote {cfg.out} ({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
    info: dict[str, Any] = {"subnets": len(m.subnets), "first_subnet": m.subnets[0].id,
                            "subnets_per_hour": m.subnets_per_hour, "subnet_schedule": m.subnet_schedule,
                            "losses": [s.loss for s in m.subnets], "out": cfg.out}
    history = partition_history(m.subnet_segments or [])
    if cfg.repartition is not None:
        info["partitions"] = [dataclasses.asdict(h) for h in history]
    if args.json:
        print(json.dumps(info))
    else:
        print(f"{len(m.subnets)} subnets ({m.subnet_schedule}), {m.subnets_per_hour:.5g} subnets/hour, "
              f"last loss {m.subnets[-1].loss:.6f}")
        if cfg.repartition is not None:
            print(_history_line(cfg.repartition, history))
    return 0


__all__ = ["PartitionSpan", "cmd_run_supernet", "is_supernet_model", "partition_history", "precheck", "supernet_config"]
