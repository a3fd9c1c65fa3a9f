"""Measured runs as calibration and validation read them: plan, model, cluster, clean timings.

A measured trace (``mindpipe run --out``) holds the plan, the model and every step's time. Steps
that do not represent steady state are left out: the warm-up steps, and the step profiled with
``--profile-step`` (torch.profiler slows it down). The run's iteration time is the median of the
rest — on a shared machine single steps swing by tens of percent, and the median resists that.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from mindpipe.traces.catalog import DeviceSpec, get_device
from mindpipe.traces.chrome_trace import TimelineEvent, chunk_of
from mindpipe.traces.config import Cluster, Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.measured import Measurement
from mindpipe.traces.schema import to_dict
from mindpipe.traces.trace import Trace


def run_label(source: str) -> str:
    """A measured file's name without ``.json``/``.json.gz``: the short label tables use."""
    name = Path(source).name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name


@dataclass
class MeasuredRun:
    """One measured run, ready for calibration or validation.

    Attributes:
        source: The file it came from.
        measurement: The raw records.
        model, cluster, device: What ran, where (one node of ``world_size / nodes`` ranks each).
        clean_steps: Measured steps that were neither warm-up nor profiled.
        iteration_s: Median iteration time over ``clean_steps``.
    """

    source: str
    measurement: Measurement
    model: Model
    cluster: Cluster
    device: DeviceSpec
    clean_steps: list[int]
    iteration_s: float

    @property
    def plan(self) -> Plan:
        """The plan that ran."""
        return self.measurement.plan

    @property
    def name(self) -> str:
        """The file's name without ``.json``/``.json.gz``, a short label for tables."""
        return run_label(self.source)


def measured_events(run: MeasuredRun, step: int | None = None) -> list[TimelineEvent]:
    """Timeline events of one clean step of the representative pipeline (dp 0, tp 0, cp 0).

    Ranks are numbered by pipeline position, as the simulator's timeline numbers them, and
    times start at the step's first action, so the two can be drawn on one axis. The actions, the
    waits and the optimizer step are events of the simulator's kinds (an ``optimizer`` compute span,
    as :mod:`mindpipe.simulator.engine` records it), so both panels show the same actions.
    """
    meas = run.measurement
    step = step if step is not None else run.clean_steps[len(run.clean_steps) // 2]
    pipe = {r.rank: r.pp_rank for r in meas.ranks if r.dp_rank == 0 and r.tp_rank == 0 and r.cp_rank == 0}
    acts = [a for a in meas.actions if a.step == step and a.rank in pipe]
    comms = [c for c in meas.comms if c.step == step and c.rank in pipe and c.kind != "collective"]
    if not acts:
        return []
    t0 = min(a.start_s for a in acts)
    chunk = chunk_of((a.rank, a.stage) for a in acts)
    events = [TimelineEvent(pipe[a.rank], "compute", f"{a.stage}{a.kind}{a.microbatch}", a.start_s - t0,
                            a.start_s + a.duration_s - t0, a.kind, chunk=chunk[a.rank, a.stage]) for a in acts]
    events += [TimelineEvent(pipe[c.rank], "comm", c.op, c.start_s - t0, c.start_s + c.duration_s - t0,
                             "p2p" if c.kind == "p2p_wait" else c.axis) for c in comms]  # the axis it ran over
    events += [TimelineEvent(pipe[o.rank], "compute", "optimizer", o.start_s - t0, o.start_s + o.duration_s - t0,
                             "optimizer") for o in meas.optimizer if o.step == step and o.rank in pipe]
    return events


def measured_machine(source: str, meas: Measurement, catalog: dict[str, DeviceSpec] | None = None
                     ) -> tuple[DeviceSpec, Cluster]:
    """The catalog device a measured run ran on, and its cluster: the run's hosts as nodes, each
    with an equal share of the ranks.

    Raises:
        ContractError: naming ``source``: an unknown device, or hosts the catalog gives no link
            between (CPU hosts: no NIC to price).
    """
    try:
        device = get_device(meas.device_name, catalog)
    except ContractError as e:
        raise ContractError(source, "measurement.device_name", e.rule) from None
    try:
        cluster = Cluster(gpu=device.name, num_nodes=meas.nodes, gpus_per_node=max(1, meas.world_size // meas.nodes))
    except ContractError as e:
        raise ContractError(source, "measurement.nodes", f"the run used {meas.nodes} hosts: {e.rule}") from None
    return device, cluster


def load_run(path: str | Path, catalog: dict[str, DeviceSpec] | None = None) -> MeasuredRun:
    """Read a measured trace written by ``mindpipe run``.

    Raises:
        ContractError: the file is not a measured trace, or names an unknown device.
    """
    source = str(path)
    trace = Trace.load(path)
    meas = trace.measurement
    if meas is None:
        raise ContractError(source, "measurement", "not a measured run (write one with `mindpipe run --out`)")
    if trace.model is None:
        raise ContractError(source, "model", "the measured trace does not say which model ran")
    device, cluster = measured_machine(source, meas, catalog)
    return MeasuredRun(source, meas, trace.model, cluster, device, [s.step for s in meas.clean_steps], meas.iteration_s)


def merge_repeats(runs: list[MeasuredRun]) -> list[MeasuredRun]:
    """One run per distinct plan (and model): repeated runs of a plan become one whose iteration
    time is the median of theirs.

    On a shared or virtualised machine the speed drifts between runs by more than it varies within
    one (10–20 % between runs minutes apart on the 2-vCPU CI machine, a few % between steps of
    one run), so a plan measured in several rounds, interleaved with the others, is compared by
    the median of its rounds. The merged run keeps the first run's records and source.
    """
    groups: dict[str, list[MeasuredRun]] = {}
    for run in runs:
        key = json.dumps([to_dict(run.plan), to_dict(run.model), run.measurement.world_size], sort_keys=True)
        groups.setdefault(key, []).append(run)
    out = []
    for group in groups.values():
        first = group[0]
        out.append(dataclasses.replace(first, iteration_s=statistics.median(r.iteration_s for r in group)))
    return out


class Recorded(Protocol):
    """A measured run of any kind (GPT or supernet): its file and its records."""

    source: str
    measurement: Measurement


def _fingerprint(run: Recorded) -> str:
    """A digest of what ``run`` recorded (its plan and every timing): two real runs never record
    the same timings, so equal digests mean one measurement under two names."""
    return hashlib.sha256(json.dumps(to_dict(run.measurement), sort_keys=True).encode()).hexdigest()


def check_distinct(fitted: Sequence[Recorded], held_out: Sequence[Recorded] = ()) -> None:
    """Refuse one measurement given twice: among the runs fitted on (a copied or renamed file
    would count twice in the fit), or both fitted on and held out (its "held-out" error would be
    an in-sample one).

    Raises:
        ContractError: naming the file given again and the first.
    """
    seen: dict[str, str] = {}
    for run in fitted:
        first = seen.setdefault(_fingerprint(run), run.source)
        if first != run.source:
            raise ContractError(run.source, None, f"records the same measurement as {first}: "
                                "each measured run counts once in the fit")
    for run in held_out:
        fitted_as = seen.get(_fingerprint(run))
        if fitted_as is not None:
            same = Path(fitted_as).resolve() == Path(run.source).resolve()
            raise ContractError("--holdout", None, f"{run.source} is both fitted on and held out" + (
                "" if same else f" (it records the same measurement as {fitted_as})"))


def load_runs(paths: list[str] | list[Path], catalog: dict[str, DeviceSpec] | None = None) -> list[MeasuredRun]:
    """:func:`load_run` for each path (errors name the file)."""
    if not paths:
        raise ContractError("", "measured", "no measured runs given")
    return [load_run(p, catalog) for p in paths]


__all__ = ["MeasuredRun", "Recorded", "check_distinct", "load_run", "load_runs", "measured_events", "measured_machine", "merge_repeats", "run_label"]
