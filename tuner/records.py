"""Typed records that cross the tuner's seams: an evaluation, its metrics, its score under an objective.

:class:`EvaluationRecord` is what an evaluation returns (in a worker process or on a Dask
cluster), what the sweep store persists one JSON line per, and what the sweep scores;
:class:`ScoredRecord` is that record under an objective (value, loss, verdict), what the sweep
result, the outputs and the search quality benchmark read. Outcomes and reasons are codes:
:class:`Status` (what the evaluation found), :class:`MemoryCode` (which memory check refused the
plan) or a :class:`~mindpipe.tuner.rules.Rule` (which plan rule an invalid point broke), and
:class:`Verdict` (why a scored plan is or is not feasible).
"""

from __future__ import annotations

import dataclasses
import traceback
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from mindpipe.simulator.subnet_sim import SupernetResult
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.result import SimulationResult
from mindpipe.traces.schema import from_dict, to_dict
from mindpipe.tuner.keys import Point, what_if_used
from mindpipe.tuner.rules import Rule, rule_of


class Status(StrEnum):
    """What an evaluation found."""

    OK = "ok"
    OUT_OF_MEMORY = "out_of_memory"
    INVALID = "invalid"
    ERROR = "error"


class MemoryCode(StrEnum):
    """Which check found a plan out of memory."""

    ESTIMATE = "memory_estimate"  # the memory model, before simulating (costs no budget)
    SIMULATED_PEAK = "simulated_peak"  # the simulation's own peak


class Verdict(StrEnum):
    """Why a scored plan is feasible or not (the ``reason`` column; ``infeasible_by_reason`` keys)."""

    FEASIBLE = "feasible"
    OUT_OF_MEMORY = "out_of_memory"
    INVALID = "invalid"
    ERROR = "error"
    NO_VALUE = "no_value"
    CONSTRAINT = "constraint"


# Simulator result fields an evaluation keeps (DESIGN.md simulation-result contract).
RESULT_FIELDS = (
    "iteration_time_s", "throughput_samples_per_s", "throughput_tokens_per_s", "tflops_per_gpu", "mfu",
    "bubble_fraction", "peak_memory_gib", "fits_in_memory", "energy_j", "carbon_gco2",
)
# Columns an objective derives from them (:meth:`mindpipe.tuner.objectives.Objective.derive`).
DERIVED_FIELDS = ("energy_per_sample_j", "carbon_per_sample_g", "statistical_efficiency", "goodput_samples_per_s",
                  "iterations_to_target", "compute_hours_to_target", "wait_hours_to_target", "energy_to_target_kwh",
                  "carbon_to_target_g")


@dataclass(frozen=True)
class Metrics:
    """An evaluation's numbers: the simulator's result fields, then the objective's derived ones.

    Every field is None when unknown (a plan refused before simulating has ``peak_memory_gib`` only).
    """

    iteration_time_s: float | None = None
    throughput_samples_per_s: float | None = None
    throughput_tokens_per_s: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    bubble_fraction: float | None = None
    peak_memory_gib: float | None = None
    fits_in_memory: bool | None = None
    energy_j: float | None = None
    carbon_gco2: float | None = None
    exposed_dp_comm_s: float | None = None
    energy_per_sample_j: float | None = None
    carbon_per_sample_g: float | None = None
    statistical_efficiency: float | None = None
    goodput_samples_per_s: float | None = None
    subnets_per_hour: float | None = None
    iterations_to_target: float | None = None
    compute_hours_to_target: float | None = None
    wait_hours_to_target: float | None = None
    energy_to_target_kwh: float | None = None
    carbon_to_target_g: float | None = None

    @classmethod
    def of_result(cls, result: SimulationResult) -> Metrics:
        """The fields of a simulation result (and its exposed data-parallel communication)."""
        return cls(**{k: getattr(result, k) for k in RESULT_FIELDS},
                   exposed_dp_comm_s=result.extra.exposed_dp_comm_s)

    @classmethod
    def of_supernet(cls, result: SupernetResult, seq_len: int) -> Metrics:
        """The fields of a supernet simulation: subnets per hour, and its time per subnet as the iteration time.

        One subnet trains ``samples_per_subnet`` = micro_batch_size × dp sequences of ``seq_len``
        tokens, which gives samples and tokens per second; the supernet simulator prices no energy
        (those stay None).
        """
        samples_per_s = result.subnets_per_hour / 3600.0 * result.samples_per_subnet
        return cls(iteration_time_s=result.time_per_subnet_s, throughput_samples_per_s=samples_per_s,
                   throughput_tokens_per_s=samples_per_s * seq_len, bubble_fraction=result.bubble_fraction,
                   peak_memory_gib=max(st.memory.total_gib for st in result.stages),
                   fits_in_memory=result.fits_in_memory, subnets_per_hour=result.subnets_per_hour)

    def get(self, name: str) -> Any:
        """A metric by column name (None when unknown or not a metric)."""
        return getattr(self, name, None)

    def to_json(self) -> dict[str, Any]:
        """The known metrics as a JSON object."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Metrics:
        """Inverse of :meth:`to_json`."""
        return cls(**data)


@dataclass
class EvaluationRecord:
    """One evaluation of a point (:func:`mindpipe.tuner.evaluate.evaluate`).

    Attributes:
        key: The point's identity (:func:`mindpipe.tuner.keys.point_key`).
        point: The point evaluated.
        status: What the evaluation found.
        plan: The plan with its partition (None when it could not be built).
        code: ``out_of_memory``: a :class:`MemoryCode`; ``invalid``: the :class:`Rule` broken; else None.
        simulated: Whether the event simulation ran (what costs budget).
        metrics: The simulator's numbers (``peak_memory_gib`` only when refused before simulating).
        message: Details in words (the memory figures, the rule with its numbers, the exception).
        eval_s: Wall time of the evaluation.
    """

    key: str
    point: Point
    status: Status = Status.OK
    plan: Plan | None = None
    code: Rule | MemoryCode | None = None
    simulated: bool = False
    metrics: Metrics = field(default_factory=Metrics)
    message: str = ""
    eval_s: float = 0.0

    def __post_init__(self) -> None:
        expected = {Status.OUT_OF_MEMORY: MemoryCode, Status.INVALID: Rule}.get(self.status)
        if (expected is None and self.code is not None) or (expected is not None and not isinstance(self.code, expected)):
            raise ValueError(f"a {self.status.value} evaluation carries {self.code!r}")

    @property
    def costs_budget(self) -> bool:
        """Simulations cost budget, and so do errors (a simulator bug must not run through a whole space)."""
        return self.simulated or self.status is Status.ERROR

    def failed(self, e: Exception) -> None:
        """Record what stopped the evaluation: a broken plan rule (an input error) or a bug.

        A bug must not end a long sweep: it is kept, with its traceback, and counted as an error.
        """
        if isinstance(e, ContractError):
            self.status, self.code, self.message = Status.INVALID, rule_of(e), str(e)
        else:
            self.status, self.code = Status.ERROR, None
            self.message = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"

    def to_json(self) -> dict[str, Any]:
        """One line of the sweep store."""
        return {"key": self.key, "point": dict(self.point), "status": self.status.value,
                "plan": to_dict(self.plan) if self.plan is not None else None,
                "code": self.code.value if self.code is not None else None, "simulated": self.simulated,
                "metrics": self.metrics.to_json(), "message": self.message, "eval_s": self.eval_s}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EvaluationRecord:
        """Inverse of :meth:`to_json`.

        Raises:
            KeyError, ValueError, TypeError, ContractError: not a record of this format.
        """
        status = Status(data["status"])
        code_types: dict[Status, type[MemoryCode] | type[Rule]] = {Status.OUT_OF_MEMORY: MemoryCode,
                                                                   Status.INVALID: Rule}
        code_type = code_types.get(status)
        code = code_type(data["code"]) if code_type is not None else None
        plan = from_dict(Plan, data["plan"], "evaluations.jsonl") if data["plan"] is not None else None
        return cls(key=data["key"], point=dict(data["point"]), status=status, plan=plan, code=code,
                   simulated=bool(data["simulated"]), metrics=Metrics.from_json(data["metrics"]),
                   message=data["message"], eval_s=float(data["eval_s"]))


@dataclass
class ScoredRecord:
    """An evaluation under an objective (:func:`mindpipe.tuner.sweep.annotate`).

    Attributes:
        evaluation: What the evaluation returned.
        metrics: Its metrics with the objective's derived columns.
        verdict: Feasible, or why not.
        value: The objective in natural units (None when not simulated or unknown).
        loss: What the searcher minimises (None unless feasible).
        broken: The constraints the plan breaks, as text.
        index: Position in the sweep (proposal order).
    """

    evaluation: EvaluationRecord
    metrics: Metrics
    verdict: Verdict
    value: float | None = None
    loss: float | None = None
    broken: list[str] = field(default_factory=list)
    index: int = -1

    @property
    def feasible(self) -> bool:
        """Within memory, simulated, valued, and meeting every constraint."""
        return self.verdict is Verdict.FEASIBLE

    @property
    def key(self) -> str:
        """The point's identity."""
        return self.evaluation.key

    @property
    def point(self) -> Point:
        """The point evaluated."""
        return self.evaluation.point

    @property
    def plan(self) -> Plan | None:
        """The plan with its partition."""
        return self.evaluation.plan

    @property
    def simulated(self) -> bool:
        """Whether the event simulation ran."""
        return self.evaluation.simulated

    @property
    def what_if(self) -> list[str]:
        """The what-if knobs the plan uses (:func:`mindpipe.tuner.keys.what_if_used`)."""
        return what_if_used(self.point)

    @property
    def message(self) -> str:
        """The constraints broken, else the evaluation's message."""
        return "violates " + ", ".join(self.broken) if self.broken else self.evaluation.message


__all__ = [
    "DERIVED_FIELDS",
    "RESULT_FIELDS",
    "EvaluationRecord",
    "MemoryCode",
    "Metrics",
    "ScoredRecord",
    "Status",
    "Verdict",
]
