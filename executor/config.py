"""What one executor run needs besides the plan, and the shared command-line arguments.

:class:`RunConfig` is built from the command line of ``mindpipe run`` or ``python -m mindpipe.executor``
(:func:`add_run_arguments` serves both) and travels to every rank as JSON. This module is
torch-free so ``mindpipe --help`` and the pre-launch checks never import torch.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindpipe.executor.checkpoint_trust import check_checkpoint_options
from mindpipe.traces.builtin import config_source, load_model, load_plan
from mindpipe.traces.config import Model, Plan, non_negative, one_of, positive
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import integer, shown, within_limit
from mindpipe.traces.reading import CONFIG, TEXT_DATA, check_regular_file
from mindpipe.traces.schema import from_dict, read_json, write_json

SCHEDULE_SOURCES = ("auto", "torch", "simulator")
DEVICES = ("auto", "cpu", "cuda")
RUN_CONFIG_FORMAT_VERSION = 1
DEFAULT_MODEL = "gpt-mini"  # the model of a hand-written plan run without --model
# AdamW's peak learning rate by model size, GPT-3's (Brown et al. 2020, "Language Models are
# Few-Shot Learners", Table 2.1): parameters, learning rate.
GPT3_LEARNING_RATES = ((125e6, 6.0e-4), (350e6, 3.0e-4), (760e6, 2.5e-4), (1.3e9, 2.0e-4), (2.7e9, 1.6e-4),
                       (6.7e9, 1.2e-4), (13e9, 1.0e-4), (175e9, 0.6e-4))
SMALL_MODEL_LR = 1e-3  # the executor's learning rate for the small models of the tests and the demo


def default_lr(params: int) -> float:
    """``mindpipe run``'s learning rate when ``--lr`` is not given, for a model of ``params`` parameters.

    GPT-3's table (:data:`GPT3_LEARNING_RATES`), interpolated linearly in log(parameters) and
    log(rate) between its sizes and constant past 175B; below 125M its first segment's slope
    carried on down, capped at :data:`SMALL_MODEL_LR` (reached at about 58M parameters), so the
    small CPU models keep the rate they always trained at. A constant 1e-3 made a 1.4B-parameter
    model's loss rise within a few steps.
    """
    x = math.log(max(params, 1))
    points = [(math.log(n), math.log(lr)) for n, lr in GPT3_LEARNING_RATES]
    if x >= points[-1][0]:
        return GPT3_LEARNING_RATES[-1][1]
    i = max((k for k in range(len(points) - 1) if points[k][0] <= x), default=0)  # below 125M: the first segment
    (x0, y0), (x1, y1) = points[i], points[i + 1]
    return min(SMALL_MODEL_LR, math.exp(y0 + (y1 - y0) * (x - x0) / (x1 - x0)))


@dataclass
class RunConfig:
    """One training run of a plan.

    Attributes:
        model: The model contract.
        plan: The plan (``dp``, ``tp``, ``pp``, schedule, recompute, precision ...).
        steps: Run until this global step (a resumed run continues from its checkpoint's step).
        seed: Seed of the initial weights and of the synthetic data.
        data: ``synthetic`` (deterministic random tokens) or a text file read as byte tokens.
        lr, weight_decay: AdamW hyper-parameters.
        out: Where rank 0 writes the measured trace (``measured.json``).
        timeline: Where rank 0 writes the Chrome-trace timeline (default: beside ``out``).
        checkpoint_dir: torch.distributed.checkpoint directory; written at the end of the run
            and every ``checkpoint_every`` steps (0: only at the end); only the newest
            ``keep_checkpoints`` complete steps are kept (0: all).
        resume: Load the latest checkpoint in ``checkpoint_dir`` before training.
        resume_from: Load the checkpoint of this step instead of the latest (implies ``resume``).
        schedule_source: ``torch`` runs torch's schedule class of the plan's schedule;
            ``simulator`` runs the action table of the simulator's schedule; ``auto`` uses the
            simulator's table when :mod:`mindpipe.simulator.schedules` is present, else torch's class.
        device: ``auto`` (CUDA when present, else CPU), ``cpu`` or ``cuda``.
        timeout_s: Collective timeout of every process group (a dead peer ends the run).
        warmup_steps: Leading steps left out of the aggregates.
        profile_step: Step whose collectives are recorded with torch.profiler (0: none).
        memory_budget_gib: Emulated device capacity per rank: a plan the simulator predicts
            over it is refused before launch, and a rank whose accounted memory
            (:mod:`mindpipe.executor.memory_account`) exceeds it stops the run. None: the device's own.
    """

    model: Model
    plan: Plan
    steps: int
    seed: int = 0
    data: str = "synthetic"
    lr: float = SMALL_MODEL_LR
    weight_decay: float = 0.0
    out: str | None = "measured.json"
    timeline: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    keep_checkpoints: int = 0
    resume: bool = False
    resume_from: int | None = None
    schedule_source: str = "auto"
    device: str = "auto"
    timeout_s: float = 300.0
    warmup_steps: int = 1
    profile_step: int = 0
    memory_budget_gib: float | None = None
    format_version: int = RUN_CONFIG_FORMAT_VERSION

    def __post_init__(self) -> None:
        integer("steps", self.steps, 1, "train_steps")
        integer("seed", self.seed, 0, "seed")
        positive("lr", self.lr)
        positive("timeout_s", self.timeout_s)
        within_limit("timeout_s", self.timeout_s)
        non_negative("weight_decay", self.weight_decay)
        for key in ("checkpoint_every", "keep_checkpoints", "warmup_steps", "profile_step"):
            integer(key, getattr(self, key), 0, "train_steps")
        if self.profile_step > self.steps:
            raise ContractError("", "profile_step", f"--profile-step {self.profile_step} is after the run's last step "
                                                    f"(--steps {self.steps}): that step never runs")
        one_of("schedule_source", self.schedule_source, SCHEDULE_SOURCES)
        if self.memory_budget_gib is not None:
            positive("memory_budget_gib", self.memory_budget_gib)
        one_of("device", self.device, DEVICES)
        if self.resume_from is not None:
            integer("resume_from", self.resume_from, 1, "train_steps")
            self.resume = True
        check_checkpoint_options(self.checkpoint_dir, resume=self.resume, checkpoint_every=self.checkpoint_every,
                                 keep_checkpoints=self.keep_checkpoints)
        if self.data != "synthetic":
            # Checked here, before any rank starts: a regular file within the training-text limit.
            try:
                size = check_regular_file(self.data, TEXT_DATA)
            except ContractError as e:
                raise ContractError("", "data", f"data={self.data!r}: {e.rule} ('synthetic' or a text file)") from None
            if size < self.model.seq_len + 2:
                raise ContractError("", "data", f"data={self.data!r} holds {size} bytes; seq_len={self.model.seq_len} "
                                                f"needs at least seq_len+2={self.model.seq_len + 2}")

    @property
    def timeline_path(self) -> str | None:
        """The timeline file: ``timeline`` or ``<out stem>.timeline.json`` beside ``out``."""
        if self.timeline:
            return self.timeline
        if not self.out:
            return None
        p = Path(self.out)
        return str(p.with_name(p.stem + ".timeline.json"))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write as JSON (how the launcher hands the config to every rank)."""
        write_json(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RunConfig:
        """Read a config written by :meth:`save`."""
        return from_dict(cls, read_json(path, CONFIG), str(path))


def add_run_arguments(p: argparse.ArgumentParser, launcher: bool) -> None:
    """Arguments of ``mindpipe run`` (``launcher=True``) and ``python -m mindpipe.executor``."""
    p.add_argument("plan", metavar="PLAN", help="plan JSON file or inline JSON")
    if launcher:
        p.add_argument("--nproc", type=int, required=True, help="processes (ranks) per node")
        g = p.add_argument_group("multi-node rendezvous (passed to torchrun)")
        g.add_argument("--nnodes", default="1", help="nodes, or MIN:MAX (torchrun --nnodes)")
        g.add_argument("--node-rank", type=int, default=None, help="this node's rank (static rendezvous)")
        g.add_argument("--rdzv-backend", default=None, help="torchrun rendezvous backend (e.g. c10d)")
        g.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous")
        g.add_argument("--rdzv-id", default=None, help="job id shared by all nodes")
        g.add_argument("--master-addr", default=None, help="static rendezvous address (default 127.0.0.1 on one node)")
        g.add_argument("--master-port", type=int, default=None, help="static rendezvous port (default: a free port)")
        p.add_argument("--run-timeout", type=float, default=None,
                       help="launcher watchdog: end the whole run after this many seconds (default: none)")
    p.add_argument("--steps", type=int, required=True, help="train until this global step")
    p.add_argument("--model", default=None,
                   help="model JSON file, inline JSON or built-in name (default: the plan's made_for.model, else gpt-mini)")
    p.add_argument("--out", default="measured.json", help="measured trace to write (default measured.json)")
    p.add_argument("--timeline", default=None, help="Chrome-trace timeline (default: OUT with .timeline.json)")
    p.add_argument("--checkpoint-dir", default=None, help="torch.distributed.checkpoint directory")
    p.add_argument("--checkpoint-every", type=int, default=0, help="also checkpoint every N steps (default: end only)")
    p.add_argument("--keep-checkpoints", type=int, default=0, metavar="K",
                   help="keep only the newest K complete checkpoint steps, deleting older ones (default 0: keep all)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --checkpoint-dir")
    p.add_argument("--resume-from", type=int, default=None, metavar="STEP", help="continue from the checkpoint of STEP")
    p.add_argument("--data", default="synthetic", help="'synthetic' (default) or a text file read as byte tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=None,
                   help="AdamW's learning rate (default: GPT-3's for the model's size, at most 1e-3)")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--schedule-source", default="auto", choices=SCHEDULE_SOURCES,
                   help="torch's schedule class or the simulator's action table (default auto)")
    p.add_argument("--device", default="auto", choices=DEVICES, help="auto: CUDA+NCCL if present, else CPU+gloo")
    p.add_argument("--timeout", type=float, default=300.0, help="collective timeout in seconds (default 300)")
    p.add_argument("--warmup-steps", type=int, default=1, help="steps left out of the aggregates (default 1)")
    p.add_argument("--profile-step", type=int, default=0, help="record the collectives of this step (default: none)")
    p.add_argument("--memory-budget-gib", type=float, default=None, metavar="GIB",
                   help="emulate a device of GIB GiB per rank: refuse a plan the simulator says does not fit, "
                        "stop a rank whose accounted memory exceeds it")
    p.add_argument("--context-switch", default="auto", choices=("auto", "on", "off"),
                   help="supernet runs: keep only the in-flight subnets' candidates on the device (auto: on for csp)")
    p.add_argument("--repartition", type=float, default=None, metavar="THRESHOLD",
                   help="supernet runs: at each --checkpoint-every boundary, re-solve the partition from measured "
                        "stage times when their max/mean exceeds THRESHOLD (e.g. 1.1; default off); a move that "
                        "runs more than THRESHOLD times slower per subnet is undone")
    p.add_argument("--json", action="store_true", help="print a JSON summary of the run on stdout")


_NNODES_RE = re.compile(r"([0-9]{1,9})(?::([0-9]{1,9}))?")
MAX_PORT = 65535


def check_launch_arguments(args: argparse.Namespace) -> None:
    """Refuse launcher arguments torchrun would choke on (or run forever with), before anything starts.

    ``--nproc`` is 1 to the ``gpus_per_node`` limit, ``--nnodes`` N or MIN:MAX within the
    ``num_nodes`` limit, ``--node-rank`` below the nodes, ``--master-port`` 1 to 65535,
    ``--run-timeout`` a number of seconds within the ``timeout_s`` limit. Several nodes need
    either torchrun's rendezvous (``--rdzv-backend``/``--rdzv-endpoint``) or, statically, a fixed
    node count with ``--node-rank``, ``--master-addr`` and ``--master-port`` on every node.

    Raises:
        ContractError: ``command line: nnodes='many' is not N or MIN:MAX ...``.
    """

    def fail(key: str, rule: str) -> None:
        raise ContractError("command line", key, rule)

    try:
        integer("nproc", args.nproc, 1, "gpus_per_node")
        m = _NNODES_RE.fullmatch(str(args.nnodes).strip())
        lo, hi = (int(m[1]), int(m[2] or m[1])) if m else (0, 0)
        if not 1 <= lo <= hi:
            fail("nnodes", f"nnodes={shown(args.nnodes)} is not N or MIN:MAX with 1 <= MIN <= MAX")
        within_limit("nnodes", hi, "num_nodes")
        if args.node_rank is not None:
            integer("node_rank", args.node_rank, 0)
            if args.node_rank >= hi:
                fail("node_rank", f"node_rank={args.node_rank} must be below nnodes={hi}")
        if args.rdzv_endpoint is not None:
            endpoint = str(args.rdzv_endpoint).strip()
            # torchrun's parse_rendezvous_endpoint: HOST, HOST:PORT or [IPv6]:PORT.
            port = endpoint.rsplit(":", 1)[1] if ":" in endpoint and not endpoint.endswith("]") else None
            if not endpoint or (port is not None and not (port.isdecimal() and int(port) <= MAX_PORT)):
                fail("rdzv_endpoint", f"rdzv_endpoint={shown(args.rdzv_endpoint)} is not HOST or HOST:PORT "
                     f"with a port up to {MAX_PORT}")
        if args.rdzv_backend is not None and args.rdzv_backend not in rendezvous_backends():
            fail("rdzv_backend", f"rdzv_backend={shown(args.rdzv_backend)} is not one of torchrun's rendezvous "
                 f"backends ({', '.join(rendezvous_backends())})")
        if hi > 1 and not (args.rdzv_backend or args.rdzv_endpoint):
            # torchrun's static rendezvous: every node must name the same store and its own rank.
            # Unset, each node would default to node rank 0 and pick its own free port: a hang.
            if lo != hi:
                fail("nnodes", f"nnodes={shown(args.nnodes)} (a range) needs --rdzv-backend and --rdzv-endpoint")
            missing = [flag for flag, value in (("--node-rank", args.node_rank), ("--master-addr", args.master_addr),
                                               ("--master-port", args.master_port)) if value is None]
            if missing:
                fail("nnodes", f"nnodes={hi} without --rdzv-endpoint needs {', '.join(missing)} on every node "
                     "(the same --master-addr and --master-port everywhere, a different --node-rank on each)")
        if args.master_port is not None:
            integer("master_port", args.master_port, 1)
            if args.master_port > MAX_PORT:
                fail("master_port", f"master_port={args.master_port} must be at most {MAX_PORT}")
        if args.run_timeout is not None:
            positive("run_timeout", args.run_timeout)
            within_limit("run_timeout", args.run_timeout, "timeout_s")
    except ContractError as e:
        raise ContractError("command line", e.key, e.rule) from None


def rendezvous_backends() -> tuple[str, ...]:
    """torchrun's rendezvous backends: its four built-ins and any a ``torchrun.handlers`` entry point adds.

    (``torch.distributed.elastic.rendezvous.registry`` registers the same names; read here without
    importing torch, which the launcher does not.)
    """
    plugins = tuple(ep.name for ep in importlib.metadata.entry_points(group="torchrun.handlers"))
    return ("c10d", "static", "etcd", "etcd-v2", *plugins)


def plan_source(arg: str) -> str:
    """How errors name the plan: its file, or ``<inline plan>`` for inline JSON (as the plan's loader
    and ``simulate`` name it: :func:`mindpipe.traces.builtin.config_source`)."""
    return config_source(arg, "plan")


def resolve_model(model_arg: str | None, plan: Plan, source: str = "plan") -> Model:
    """The model to train: ``--model``, else the one the plan was tuned for, else ``gpt-mini``.

    Raises:
        ContractError: ``--model`` names another model than the plan's ``made_for.model``, e.g.
            ``plan.json: made_for: the plan was tuned for gpt-13b; --model gives gpt-mini``.
    """
    made = plan.made_for
    if made is not None and made.model is None:  # a supernet plan: the supernet runner takes it
        raise ContractError(source, "made_for", f"the plan was tuned for the supernet {made.label}; "
                            f"run it with --model {made.supernet.name if made.supernet and made.supernet.name else 'SUPERNET'}")
    if model_arg is None:
        return made.model if made is not None and made.model is not None else load_model(DEFAULT_MODEL)
    model = load_model(model_arg)
    if made is not None and made.model is not None and not made.model.same_shape(model):
        raise ContractError(source, "made_for", f"the plan was tuned for {made.model.label}; --model gives {model.label}")
    return model


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """Build and validate a :class:`RunConfig` from parsed arguments.

    The model is ``--model``, or the plan's ``made_for.model`` when it is not given (a tuned
    plan carries the model it was tuned for), else ``gpt-mini``.

    Raises:
        ContractError: a malformed plan or model, a model other than the one the plan was tuned
            for, or an impossible option (names the key).
    """
    plan = load_plan(args.plan)
    model = resolve_model(args.model, plan, plan_source(args.plan))
    fields: dict[str, Any] = {
        "model": model, "plan": plan, "steps": args.steps, "seed": args.seed, "data": args.data,
        "lr": default_lr(model.param_count()) if args.lr is None else args.lr,
        "weight_decay": args.weight_decay, "out": args.out, "timeline": args.timeline,
        "checkpoint_dir": args.checkpoint_dir, "checkpoint_every": args.checkpoint_every,
        "keep_checkpoints": args.keep_checkpoints, "resume": args.resume,
        "resume_from": args.resume_from,
        "schedule_source": args.schedule_source, "device": args.device, "timeout_s": args.timeout,
        "warmup_steps": args.warmup_steps, "profile_step": args.profile_step,
        "memory_budget_gib": args.memory_budget_gib,
    }
    try:
        return RunConfig(**fields)
    except ContractError as e:
        raise ContractError("command line", e.key, e.rule) from None


__all__ = ["DEFAULT_MODEL", "GPT3_LEARNING_RATES", "MAX_PORT", "SMALL_MODEL_LR", "RunConfig", "add_run_arguments", "check_launch_arguments", "config_from_args", "default_lr", "plan_source", "resolve_model"]
