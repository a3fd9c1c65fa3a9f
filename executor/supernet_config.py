"""What a supernet run needs: :class:`SupernetRunConfig`, and the checks made before any rank starts.

``mindpipe run PLAN --model supernet-mini --nproc N --steps S`` trains S subnets (``--steps``
counts subnets for a supernet) with the plan's ``subnet_schedule``. The config travels to every
rank as JSON like :class:`~mindpipe.executor.config.RunConfig`; a file holding a ``supernet`` key
is this one (:func:`is_supernet_config`). This module is torch-free.

**Context switching** (``--context-switch auto|on|off``, auto: on for ``csp``): only the chosen
candidates of the subnets in flight on a stage are resident on the device, the rest of the
supernet waits in a host pool. It is a run flag, not a plan key: it changes where parameters wait,
never what is computed (a run with it is bit-identical to one without), so the plan — what the
tuner searches and the simulator prices — stays the same; only the memory check differs.

**Memory check** (``--memory-budget-gib``): a rank's model state — parameters, gradients and two
AdamW moments, 4 × 4 bytes per fp32 parameter, counted by the supernet contract's
:meth:`~mindpipe.traces.supernet.Candidate.param_count` — must fit the budget. Without switching
that is every candidate of the stage's layers; with switching at most ``min(K_l, window + 1)``
candidates of layer ``l`` (the window's subnets in flight plus the one prefetched), its largest
ones (``K_l``: the candidates the layer holds, the whole pool unless ``layer_candidates`` narrows it).
Activations are not in this check (they are a few micro-batches of ``seq_len × hidden`` floats
per layer); the run measures resident bytes and stops if they exceed the budget.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from mindpipe.executor.checkpoint_trust import check_checkpoint_options, read_record
from mindpipe.traces.config import Plan, non_negative, one_of, positive
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import integer
from mindpipe.traces.reading import CONFIG
from mindpipe.traces.result import GIB
from mindpipe.traces.schema import from_dict, read_json, to_dict, write_json
from mindpipe.traces.supernet import (
    Supernet,
    check_supernet_plan,
    subnet_batch,
    subnet_schedule,
    subnet_window,
    supernet_stage_layers,
)

CONTEXT_SWITCH = ("auto", "on", "off")
MODEL_STATE_BYTES_PER_PARAM = 16  # fp32 weight + gradient + AdamW's two moments


@dataclass
class SupernetRunConfig:
    """One supernet training run (fields as :class:`~mindpipe.executor.config.RunConfig`'s where shared).

    Attributes:
        supernet: The supernet contract.
        plan: dp × pp, ``micro_batch_size``, ``subnet_schedule``, ``subnet_window``.
        steps: Train subnets ``0 .. steps−1`` (a resumed run continues from its checkpoint).
        keep_checkpoints: Keep only the newest K complete checkpoints (0: all).
        checkpoint_every: Drain the pipeline and checkpoint every N subnets (0: at the end only);
            the schedule table is built per segment of N subnets.
        context_switch: ``auto`` (on for csp), ``on`` or ``off`` (see module docstring).
        repartition: Online repartition threshold (``--repartition``): at each drained segment
            boundary, re-solve the partition from the measured stage times when their max/mean
            exceeds it (:mod:`mindpipe.executor.supernet_repartition`); None: never. Needs
            ``checkpoint_every`` (the segments) and is at least 1.
    """

    supernet: Supernet
    plan: Plan
    steps: int
    seed: int = 0
    lr: float = 1e-3
    weight_decay: float = 0.0
    out: str | None = "measured.json"
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    keep_checkpoints: int = 0
    resume: bool = False
    device: str = "auto"
    timeout_s: float = 300.0
    memory_budget_gib: float | None = None
    context_switch: str = "auto"
    repartition: float | None = None

    def __post_init__(self) -> None:
        integer("steps", self.steps, 1, "train_steps")
        integer("seed", self.seed, 0, "seed")
        integer("checkpoint_every", self.checkpoint_every, 0, "train_steps")
        integer("keep_checkpoints", self.keep_checkpoints, 0, "train_steps")
        positive("lr", self.lr)
        non_negative("weight_decay", self.weight_decay)
        positive("timeout_s", self.timeout_s)
        one_of("device", self.device, ("auto", "cpu", "cuda"))
        one_of("context_switch", self.context_switch, CONTEXT_SWITCH)
        if self.memory_budget_gib is not None:
            positive("memory_budget_gib", self.memory_budget_gib)
        if self.repartition is not None:
            if (isinstance(self.repartition, bool) or not isinstance(self.repartition, int | float)
                    or not math.isfinite(self.repartition) or self.repartition < 1.0):
                raise ContractError("", "repartition", f"--repartition {self.repartition!r}: the max/mean stage-time "
                                    "threshold must be a finite number >= 1")
            if not self.checkpoint_every:
                raise ContractError("", "repartition", "--repartition moves layers at drained segment boundaries: "
                                    "give --checkpoint-every N (the segment length)")
            if not self.supernet.uniform_layers:
                # decide_partition solves stage time = layers × one per-layer cost + shared parts.
                raise ContractError("", "repartition", f"--repartition models every choice layer at one mean cost, "
                                    f"but {self.supernet.label}'s layers choose from their own lists "
                                    "(layer_candidates): partition it offline (mindpipe tune --partitioner balanced)")
        check_checkpoint_options(self.checkpoint_dir, resume=self.resume, keep_checkpoints=self.keep_checkpoints)
        check_supernet_plan(self.plan, self.supernet)
        if self.schedule == "async":
            # PipeDream's async needs weight stashing: B(c) must see the weights F(c) used, after B(b) updated them.
            raise ContractError("", "subnet_schedule", "async needs weight stashing (PipeDream), which the executor "
                                "does not do; the simulator prices it (run csp, sequential or sync)")
        # Every drained segment is whole batches: segments of --checkpoint-every, the last one the rest of --steps.
        for key, value in (("steps", self.steps), ("checkpoint_every", self.checkpoint_every)):
            if self.schedule == "sync" and value % self.batch:
                raise ContractError("", key, f"sync trains whole batches of subnet_window={self.batch} subnets: "
                                    f"--{key.replace('_', '-')} {value} must be a multiple of it")

    @property
    def schedule(self) -> str:
        """The plan's subnet schedule (csp by default)."""
        return subnet_schedule(self.plan)

    @property
    def window(self) -> int:
        """CSP's look-ahead window."""
        return subnet_window(self.plan)

    @property
    def batch(self) -> int:
        """Subnets per synchronous batch (``sync``): the window (:func:`~mindpipe.traces.supernet.subnet_batch`)."""
        return subnet_batch(self.plan)

    @property
    def segment(self) -> int:
        """Subnets per drained segment."""
        return self.checkpoint_every or self.steps

    @property
    def switching(self) -> bool:
        """Whether context switching is on."""
        return self.context_switch == "on" or (self.context_switch == "auto" and self.schedule == "csp")

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write as JSON (how the launcher hands the config to every rank)."""
        write_json(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SupernetRunConfig:
        """Read a config written by :meth:`save`."""
        return from_dict(cls, read_json(path, CONFIG), str(path))


def is_supernet_config(data: Any) -> bool:
    """Whether a parsed run-config document is a :class:`SupernetRunConfig`."""
    return isinstance(data, dict) and "supernet" in data


def resume_model_document(directory: str | os.PathLike[str], net: Supernet) -> dict[str, Any]:
    """The model document a resume of ``net`` from ``directory`` is checked against.

    ``to_dict(net)``, unless the checkpoint's record describes the same supernet in another document:
    one written before a supernet key existed (``layer_candidates``) lacks it, and the trust checks
    compare documents as they are, so such a checkpoint of an unchanged supernet would be refused as
    "another model" naming no difference. Read through the Supernet contract, a missing key is its
    default; the record's own document is then returned, so the checks pass exactly when the
    supernets are equal. Any trust or format error is left to
    :func:`~mindpipe.executor.checkpoint_trust.check_resume`, which reports it.
    """
    doc: dict[str, Any] = to_dict(net)
    try:
        written = read_record(directory).model
        same = from_dict(Supernet, written, "latest.json") == net
    except (ContractError, TypeError, ValueError):
        return doc
    return written if same else doc


def stage_model_state_bytes(cfg: SupernetRunConfig) -> list[int]:
    """Per pipeline stage, the most model-state bytes resident at once (see module docstring)."""
    net, h = cfg.supernet, cfg.supernet.hidden_size

    def layer_params(layer: int) -> int:
        sizes = sorted((net.candidates[k].param_count(h) for k in net.layer_choices(layer)), reverse=True)
        return sum(sizes[:min(len(sizes), cfg.window + 1)]) if cfg.switching else sum(sizes)

    layers = supernet_stage_layers(cfg.plan, net)
    shared_in = h * (net.vocab_size + net.seq_len)  # embeddings (first stage)
    shared_out = 2 * h + h * net.vocab_size  # final norm + LM head (last stage)
    state = MODEL_STATE_BYTES_PER_PARAM if net.train_shared else 4  # frozen: weights only
    out, first = [], 0
    for s, n in enumerate(layers):
        shared = (shared_in if s == 0 else 0) + (shared_out if s == len(layers) - 1 else 0)
        params = sum(layer_params(layer) for layer in range(first, first + n))
        out.append(params * MODEL_STATE_BYTES_PER_PARAM + shared * state)
        first += n
    return out


def check_memory_budget(cfg: SupernetRunConfig, source: str = "plan") -> list[int]:
    """Refuse a run whose per-stage model state exceeds ``--memory-budget-gib``; returns the bytes per stage.

    Raises:
        ContractError: one line naming the stage, its bytes, the budget and whether switching was on.
    """
    need = stage_model_state_bytes(cfg)
    if cfg.memory_budget_gib is None:
        return need
    budget = int(cfg.memory_budget_gib * GIB)
    for s, b in enumerate(need):
        if b > budget:
            how = ("with context switching" if cfg.switching else
                   "without context switching (every candidate resident; --context-switch on keeps only those in flight)")
            raise ContractError(source, "memory_budget_gib", f"pipeline stage {s} needs {b / GIB:.4g} GiB of model state "
                                f"{how}, over --memory-budget-gib {cfg.memory_budget_gib:g}")
    return need


__all__ = ["CONTEXT_SWITCH", "SupernetRunConfig", "check_memory_budget", "is_supernet_config",
           "resume_model_document", "stage_model_state_bytes"]
