"""What the tuner optimises: throughput, energy or carbon per sample, goodput; constraints; Pareto.

Every objective maps an evaluation's metrics to a *value* in natural units (samples/s, J/sample,
gCO2/sample) and a *loss* to minimise, the log of the value (negated when larger is better): plan
costs span orders of magnitude, and a surrogate model fits log-costs far better (a 2 % gap is the
same step everywhere).

Goodput (Pollux, Qiao et al. OSDI'21) = throughput × statistical efficiency. The efficiency of a
global batch B follows the gradient noise scale of McCandlish et al. (2018, arXiv 1812.06162):
training to a target needs E = E_min·(1 + B/B_crit) examples, so one example at batch B is worth
E_min/E = 1/(1 + B/B_crit) of one at a very small batch; B_crit (≈ the noise scale B_noise) is
the gradient noise scale the executor measured, carried by ``mindpipe calibrate`` into the
calibration file (:func:`critical_batch_for`), or the user's ``--critical-batch``, which
overrides it. Goodput is thus in small-batch-equivalent samples per second.

The rules name the arguments as their caller does (:class:`~mindpipe.tuner.keys.ArgNames`): an
:class:`Objective` built in Python names its fields as :func:`mindpipe.tuner.api.tune` calls them
(``objective.critical_batch``), one ``mindpipe tune`` builds names its flags (``--critical-batch``).

Supernets (NASPipe): goodput counts *subnets trained per hour* — each subnet is one architecture
trained on one batch, and a weight-sharing search needs a number of subnets, not of samples — so
``throughput`` and ``goodput`` both maximise the simulator's subnets per hour
(:class:`~mindpipe.simulator.subnet_sim.SupernetResult`). The supernet simulator prices no energy,
so ``energy`` and ``carbon`` are refused for supernets rather than valued from nothing.

Carbon with a time-shift (:class:`mindpipe.tuner.timeshift.TimeShift`: an hourly series, a start
window, the job's length): each plan's iteration is priced at the mean intensity of *its own*
cleanest schedule in the window, so the plan and the start time are chosen together.

Carbon to target (:mod:`mindpipe.tuner.target`): gCO2 to reach a training target = iterations to
target (McCandlish et al.'s S_min·(1 + B_noise/B)) × facility energy per iteration × the grid
intensity over the hours the job runs (its cleanest schedule when placed in a window, else the
annual mean); hours and kWh to target are reported beside it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from mindpipe.simulator.energy import J_PER_KWH
from mindpipe.traces.errors import ContractError
from mindpipe.traces.reading import parse_float
from mindpipe.traces.units import plural
from mindpipe.tuner.keys import CLI_ARG_NAMES, PYTHON_ARG_NAMES, ArgNames
from mindpipe.tuner.records import Metrics

if TYPE_CHECKING:
    from mindpipe.traces.calibration import Calibration
    from mindpipe.traces.config import Model
    from mindpipe.tuner.target import Placement, TrainingTarget
    from mindpipe.tuner.timeshift import TimeShift

OBJECTIVES = ("throughput", "energy", "carbon", "goodput", "carbon_to_target")
# Objective → (metric column, larger is better, unit).
_METRIC = {
    "throughput": ("throughput_samples_per_s", True, "samples/s"),
    "energy": ("energy_per_sample_j", False, "J/sample"),
    "carbon": ("carbon_per_sample_g", False, "gCO2/sample"),
    "goodput": ("goodput_samples_per_s", True, "samples/s (small-batch equivalent)"),
    "carbon_to_target": ("carbon_to_target_g", False, "gCO2 to target"),
}
SUPERNET_OBJECTIVES = ("throughput", "goodput")
_SUPERNET_METRIC = ("subnets_per_hour", True, "subnets/hour")
# Short names accepted in --constraint.
METRIC_ALIASES = {
    "throughput": "throughput_samples_per_s",
    "tokens_per_s": "throughput_tokens_per_s",
    "energy": "energy_per_sample_j",
    "energy_per_sample": "energy_per_sample_j",
    "carbon": "carbon_per_sample_g",
    "carbon_per_sample": "carbon_per_sample_g",
    "goodput": "goodput_samples_per_s",
    "iteration_time": "iteration_time_s",
    "carbon_to_target": "carbon_to_target_g",
    "hours_to_target": "compute_hours_to_target",
    "kwh_to_target": "energy_to_target_kwh",
    "memory": "peak_memory_gib",
    "peak_memory": "peak_memory_gib",
    "subnets": "subnets_per_hour",
}
CONSTRAINT_METRICS = (
    "throughput_samples_per_s", "throughput_tokens_per_s", "energy_per_sample_j", "carbon_per_sample_g",
    "goodput_samples_per_s", "iteration_time_s", "peak_memory_gib", "mfu", "bubble_fraction", "subnets_per_hour",
    "carbon_to_target_g", "compute_hours_to_target", "energy_to_target_kwh",
)
_CONSTRAINT_RE = re.compile(r"^\s*([A-Za-z_]+)\s*(<=|>=)\s*([-+0-9.eE]+)\s*$")


def statistical_efficiency(global_batch: float, critical_batch: float) -> float:
    """McCandlish et al.'s examples efficiency 1 / (1 + B / B_crit), in (0, 1]."""
    return 1.0 / (1.0 + global_batch / critical_batch)


@dataclass(frozen=True)
class CriticalBatch:
    """The critical batch goodput uses and where it came from.

    Attributes:
        value: Samples; None when goodput is not asked for (or nothing gives one).
        source: ``typed`` (``--critical-batch``), ``measured`` (the calibration's noise scale) or
            ``none``.
        note: One line for the output, e.g. ``measured gradient noise scale (3 runs, 960 samples)``.
    """

    value: float | None
    source: Literal["typed", "measured", "none"]
    note: str = ""


def needs_critical_batch(name: str, constraints: Sequence[Constraint]) -> bool:
    """True for goodput and carbon_to_target, or any objective constrained on goodput."""
    return name in ("goodput", "carbon_to_target") or any(c.metric == "goodput_samples_per_s" for c in constraints)


def critical_batch_for(typed: float | None, calibration: Calibration | None, model: Model,
                       needed: bool, *, arg_names: ArgNames = CLI_ARG_NAMES) -> CriticalBatch:
    """The critical batch: the typed value if any, else the calibration's measured noise scale.

    The measured value is taken only when ``needed`` (a goodput objective or constraint), so other
    objectives' outputs and sweep identities do not change with a calibration file. The note and
    the error name the arguments as ``arg_names`` does (``mindpipe tune``'s flags by default).

    Raises:
        ContractError: the noise scale was measured on another model (it does not carry over).
    """
    if typed is not None:
        return CriticalBatch(typed, "typed", f"{arg_names.name('--critical-batch')} (typed)")
    noise = calibration.gradient_noise if calibration is not None else None
    if not needed or noise is None:
        return CriticalBatch(None, "none")
    if not noise.model.same_shape(model):
        raise ContractError(arg_names.name("--calibration"), "gradient_noise", (
            f"the calibration's gradient noise scale was measured on {noise.model.describe()}, not "
            f"{model.describe()}; give {arg_names.name('--critical-batch')}"))
    return CriticalBatch(noise.noise_scale, "measured", (
        f"measured gradient noise scale ({plural(len(noise.runs), 'run')}, {plural(noise.samples, 'sample')}, "
        f"data {', '.join(noise.data) or 'unknown'})"))


@dataclass(frozen=True)
class Constraint:
    """``metric <= bound`` or ``metric >= bound`` on an evaluation's metrics."""

    metric: str
    op: str
    bound: float

    def holds(self, metrics: Metrics) -> bool:
        """True when the metric is present, finite and on the right side of the bound."""
        value = metrics.get(self.metric)
        if value is None or not math.isfinite(float(value)):
            return False
        return float(value) <= self.bound if self.op == "<=" else float(value) >= self.bound

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


def parse_constraint(text: str, *, arg_names: ArgNames = CLI_ARG_NAMES) -> Constraint:
    """Parse ``METRIC<=X`` / ``METRIC>=X`` (e.g. ``carbon_per_sample<=0.5``).

    Raises:
        ContractError: malformed text or unknown metric (naming the argument as ``arg_names`` does:
            ``--constraint`` by default).
    """
    source = arg_names.name("--constraint")
    m = _CONSTRAINT_RE.match(text)
    if m is None:
        raise ContractError(source, None, f"{text!r} is not METRIC<=VALUE or METRIC>=VALUE")
    name = METRIC_ALIASES.get(m[1], m[1])
    if name not in CONSTRAINT_METRICS:
        known = ", ".join(sorted({*CONSTRAINT_METRICS, *METRIC_ALIASES}))
        raise ContractError(source, None, f"{m[1]!r} is not a metric (known: {known})")
    value = parse_float(m[3], source, m[1])
    if m[2] == "<=" and value < 0:  # refused before the sweep, which could only end with no feasible plan
        raise ContractError(source, None, f"{text.strip()!r}: {m[1]} is never negative, so no plan can meet it")
    return Constraint(name, m[2], value)


@dataclass
class Objective:
    """An objective, optionally with constraints.

    Attributes:
        name: ``throughput``, ``energy``, ``carbon`` or ``goodput``.
        critical_batch: B_crit for goodput (required there, ignored otherwise).
        constraints: Every one must hold for a plan to be feasible.
        shift: For ``carbon``: the job to place in time; each plan's ``carbon_gco2`` (per
            iteration) is then its energy at the mean intensity of its best schedule, and a plan
            whose job runs past the series has no value.
        supernet: The model is a supernet: ``throughput`` and ``goodput`` are subnets per hour
            (module docstring); ``energy`` and ``carbon`` are refused.
        target: For ``carbon_to_target`` (required there): the training target and noise scale.
        placement: For ``carbon_to_target``: where the job may run in time (hourly series,
            window); without it the carbon uses the cluster's annual intensity.
        arg_names: How a refusal names the arguments (not kept): these fields as
            :func:`~mindpipe.tuner.api.tune` calls them (``objective.critical_batch``, the default),
            or ``mindpipe tune``'s flags (:data:`~mindpipe.tuner.keys.CLI_ARG_NAMES`, which the CLI passes).
    """

    name: str = "throughput"
    critical_batch: float | None = None
    constraints: list[Constraint] = field(default_factory=list)
    shift: TimeShift | None = None
    supernet: bool = False
    target: TrainingTarget | None = None
    placement: Placement | None = None
    arg_names: InitVar[ArgNames] = PYTHON_ARG_NAMES

    def __post_init__(self, arg_names: ArgNames) -> None:
        n = arg_names
        if self.name not in OBJECTIVES:
            raise ContractError(n.name("--objective"), None, f"{self.name!r} is not one of {', '.join(OBJECTIVES)}")
        if self.supernet:
            self._check_supernet(n)
            return
        critical = n.given("--critical-batch", "B", placeholder=True)
        if self.name == "goodput" and (self.critical_batch is None or self.critical_batch <= 0):
            # tune() does not read a calibration's noise scale: its caller does, with critical_batch_for
            measured = (f"or a {n.name('--calibration')} whose runs measured it" if not n.python else
                        "or a calibration's measured one (critical_batch_for)")
            raise ContractError(n.name("--critical-batch"), None, f"goodput needs {critical} (> 0), the gradient "
                                                                  f"noise scale, {measured}")
        if self.critical_batch is not None and self.critical_batch <= 0:
            raise ContractError(n.name("--critical-batch"), None, f"{self.critical_batch} must be > 0")
        if needs_critical_batch("throughput", self.constraints) and self.critical_batch is None:
            raise ContractError(n.name("--constraint"), None,
                                f"a goodput constraint needs {n.name('--critical-batch')}")
        if self.shift is not None and self.name != "carbon":
            shift = "/".join(n.names("--window", "--carbon-csv"))
            raise ContractError(n.name("--objective"), None, f"{shift} time-shifting needs "
                                                             f"{n.given('--objective', 'carbon')}, not {self.name}")
        self._check_target(n)

    def _check_target(self, n: ArgNames) -> None:
        """``carbon_to_target`` needs a target; a target or placement needs that objective."""
        if self.name == "carbon_to_target" and self.target is None:
            # on the command line the noise scale is its own flag; in Python it is the target's field
            needs = (f"{n.given('--target-samples', 'N', placeholder=True)} (and the noise scale, "
                     f"{n.given('--critical-batch', 'B', placeholder=True)})" if not n.python else
                     f"{n.name('--target-samples')} (a TrainingTarget: the samples to train and the noise scale)")
            raise ContractError(n.name("--target-samples"), None, f"carbon_to_target needs {needs}")
        if self.name != "carbon_to_target" and (self.target is not None or self.placement is not None):
            raise ContractError(n.name("--target-samples"), None, f"a training target needs "
                                f"{n.given('--objective', 'carbon_to_target')}, not {self.name}")

    def _check_supernet(self, n: ArgNames) -> None:
        """The supernet objectives' rules (module docstring)."""
        if self.name not in SUPERNET_OBJECTIVES:
            raise ContractError(n.name("--objective"), None, f"{self.name} is not available for supernets: the "
                                "supernet simulator prices no energy; use throughput (subnets trained per hour)")
        if self.critical_batch is not None:
            raise ContractError(n.name("--critical-batch"), None, "supernets: goodput counts subnets trained per "
                                f"hour, with no statistical efficiency; leave {n.name('--critical-batch')} out")
        if self.shift is not None:
            raise ContractError(n.name("--carbon-csv"), None,
                                "time-shifting prices energy, which the supernet simulator does not")
        for c in self.constraints:
            if c.metric in ("energy_per_sample_j", "carbon_per_sample_g", "goodput_samples_per_s", "mfu"):
                raise ContractError(n.name("--constraint"), None, f"{c.metric} is not simulated for supernets")

    @property
    def _spec(self) -> tuple[str, bool, str]:
        return _SUPERNET_METRIC if self.supernet else _METRIC[self.name]

    @property
    def metric(self) -> str:
        """The metric column the objective reads."""
        return self._spec[0]

    @property
    def maximize(self) -> bool:
        """True when larger values are better."""
        return self._spec[1]

    @property
    def unit(self) -> str:
        """Unit of :meth:`value`."""
        return self._spec[2]

    def describe(self) -> str:
        """One line, e.g. ``maximise throughput (samples/s) s.t. carbon_per_sample_g<=0.5``."""
        verb = "maximise" if self.maximize else "minimise"
        extra = f" s.t. {', '.join(map(str, self.constraints))}" if self.constraints else ""
        if self.supernet:
            return (f"{verb} subnets per hour ({self.unit}; goodput for supernets = subnets trained per hour)"
                    f"{extra}")
        return f"{verb} {self.name} ({self.unit}){extra}"

    def derive(self, metrics: Metrics, global_batch: int) -> Metrics:
        """The simulator's metrics with the per-sample and goodput columns filled in."""
        derived: dict[str, Any] = {}
        if metrics.energy_j is not None:
            derived["energy_per_sample_j"] = metrics.energy_j / global_batch
        if self.shift is not None:
            derived["carbon_gco2"] = self._shifted_carbon(metrics)
        carbon = derived.get("carbon_gco2", metrics.carbon_gco2)
        derived["carbon_per_sample_g"] = carbon / global_batch if carbon is not None else None
        if self.critical_batch is not None:
            eff = statistical_efficiency(global_batch, self.critical_batch)
            thr = metrics.throughput_samples_per_s
            derived["statistical_efficiency"] = eff
            derived["goodput_samples_per_s"] = thr * eff if thr is not None else None
        if self.target is not None:
            derived.update(self._to_target(metrics, global_batch))
        return dataclasses.replace(metrics, **derived)

    def _to_target(self, metrics: Metrics, global_batch: int) -> dict[str, float]:
        """The ``*_to_target`` columns (:func:`mindpipe.tuner.target.to_target`); empty when unpriced."""
        from mindpipe.tuner.target import to_target

        if self.target is None or metrics.energy_j is None or not metrics.iteration_time_s:
            return {}
        sched, ci = None, None
        if self.placement is not None:
            compute_s = self.target.iterations(global_batch) * metrics.iteration_time_s
            try:
                sched = self.placement.schedule(compute_s)
            except ContractError:  # this plan's job (at its speed) runs past the series: no value
                return {}
        elif metrics.carbon_gco2 is not None and metrics.energy_j > 0:
            ci = metrics.carbon_gco2 / (metrics.energy_j / J_PER_KWH)  # the cluster's annual intensity
        else:
            return {}
        t = to_target(self.target, global_batch, metrics.iteration_time_s, metrics.energy_j, ci, sched)
        return {"iterations_to_target": t.iterations, "compute_hours_to_target": t.compute_hours,
                "wait_hours_to_target": t.wait_hours, "energy_to_target_kwh": t.energy_kwh,
                "carbon_to_target_g": t.carbon_gco2}

    def _shifted_carbon(self, metrics: Metrics) -> float | None:
        """gCO2 of one iteration at the mean intensity of the plan's best schedule (None: no schedule)."""
        if self.shift is None or metrics.energy_j is None or not metrics.iteration_time_s:
            return None
        try:
            sched = self.shift.schedule_for(metrics.iteration_time_s)
        except ContractError:  # this plan's job (at its speed) runs past the series: no value
            return None
        return metrics.energy_j / J_PER_KWH * sched.intensity_g_per_kwh

    def value(self, metrics: Metrics) -> float | None:
        """The objective in natural units, None when unavailable."""
        v = metrics.get(self.metric)
        return None if v is None or not math.isfinite(float(v)) else float(v)

    def loss(self, value: float) -> float:
        """The quantity to minimise: ±log(value) (value 0 maps to a large finite loss)."""
        v = max(value, 1e-300)
        return -math.log(v) if self.maximize else math.log(v)

    def violated(self, metrics: Metrics) -> list[str]:
        """The constraints a plan breaks (as text)."""
        return [str(c) for c in self.constraints if not c.holds(metrics)]

    def better(self, a: float, b: float) -> bool:
        """True when value ``a`` beats ``b``."""
        return a > b if self.maximize else a < b

    def gap(self, value: float, best: float) -> float:
        """Relative shortfall of ``value`` from ``best`` (0 = optimal), in the objective's direction."""
        if best == 0:
            return 0.0 if value == 0 else math.inf
        return (best - value) / abs(best) if self.maximize else (value - best) / abs(best)


def pareto_front(rows: Sequence[Mapping[str, Any]], maximize: str = "throughput_samples_per_s",
                 minimize: str = "carbon_per_sample_g") -> list[int]:
    """Indices of the rows no other row dominates (more ``maximize`` and less ``minimize``).

    Rows missing either metric are skipped. Sorted by descending ``maximize``; ties on both keep
    the first row only.
    """
    pts = [(i, float(r[maximize]), float(r[minimize])) for i, r in enumerate(rows)
           if r.get(maximize) is not None and r.get(minimize) is not None]
    pts.sort(key=lambda t: (-t[1], t[2], t[0]))
    front: list[int] = []
    best_min = math.inf
    for i, _hi, lo in pts:
        if lo < best_min:
            front.append(i)
            best_min = lo
    return front


__all__ = [
    "CONSTRAINT_METRICS",
    "OBJECTIVES",
    "SUPERNET_OBJECTIVES",
    "Constraint",
    "CriticalBatch",
    "Objective",
    "critical_batch_for",
    "needs_critical_batch",
    "pareto_front",
    "parse_constraint",
    "statistical_efficiency",
]
