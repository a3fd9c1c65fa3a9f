"""One loader per kind of input the subcommands read, so every subcommand reads a kind the same way.

Each loader wraps the library's own (:mod:`mindpipe.traces.builtin`, :mod:`mindpipe.traces.data`,
:mod:`mindpipe.traces.calibration`, :mod:`mindpipe.simulator.calibrate.runs`,
:mod:`mindpipe.simulator.energy`, :mod:`mindpipe.simulator.perf.vtrain`); the parsing and the
rules stay there. What a loader adds is how the command line names the input: a file or a shipped
name, an optional flag (None in, None out), a flag that needs another. Bad input raises
:class:`~mindpipe.traces.errors.ContractError` naming the file (or flag), the key and the rule,
which :func:`mindpipe.cli.main` prints as one line with exit status 2.

None of these imports torch.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from mindpipe.traces.builtin import load_cluster, load_model, load_network, load_plan
from mindpipe.traces.config import Cluster, Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.supernet import Supernet
from mindpipe.traces.trace import Trace

if TYPE_CHECKING:
    from mindpipe.simulator.calibrate.runs import MeasuredRun
    from mindpipe.simulator.carbon import CarbonSeries
    from mindpipe.simulator.perf.nemo import NemoRow
    from mindpipe.simulator.perf.vtrain import VTrainRow
    from mindpipe.simulator.timeshift import Window
    from mindpipe.traces.calibration import Calibration

HourlyIntensity = tuple["CarbonSeries", dt.datetime]
"""An hourly grid-intensity series and the (aware, UTC) start of the iteration."""

VTrainDataset = Literal["vtrain-single", "vtrain-multi"]


def model(arg: str) -> Model:
    """A model: JSON file, inline JSON or built-in name (``gpt-mini``, ``gpt3-175b``)."""
    return load_model(arg)


def network(arg: str) -> Model | Supernet:
    """A GPT model or a supernet: JSON file, inline JSON or built-in name (``gpt-mini``, ``supernet-mini``)."""
    return load_network(arg)


def cluster(arg: str) -> Cluster:
    """A cluster: JSON file, inline JSON, ``DEVICE`` or ``DEVICE:NODESxPER_NODE``."""
    return load_cluster(arg)


def plan(arg: str) -> Plan:
    """A plan: JSON file (e.g. a tuner's ``best_plan.json``) or inline JSON."""
    return load_plan(arg)


def trace(arg: str, for_model: Model | None = None) -> Trace:
    """A per-layer trace: a file, or the name of a shipped trace (e.g. ``gpt-mini.cpu``).

    A file of that name wins over a shipped trace. With ``for_model``, a trace taken for another
    model is refused (:meth:`~mindpipe.traces.trace.Trace.check_model`).
    """
    from mindpipe.traces.data import load_shipped_trace, shipped_trace_names

    shipped = not Path(arg).exists() and arg in shipped_trace_names()
    loaded = load_shipped_trace(arg) if shipped else Trace.load(arg)
    if for_model is not None:
        loaded.check_model(for_model, source=arg)
    return loaded


def calibration(path: str | None) -> Calibration | None:
    """A calibration file written by ``mindpipe calibrate`` (None when the flag is not given)."""
    if path is None:
        return None
    from mindpipe.traces.calibration import load_calibration

    return load_calibration(path)


def measured_runs(paths: Sequence[str]) -> list[MeasuredRun]:
    """Measured traces written by ``mindpipe run --out``, each with its model, cluster and plan."""
    from mindpipe.simulator.calibrate.runs import load_runs

    return load_runs(list(paths))


def carbon(csv: str | None, start: str | None) -> HourlyIntensity | None:
    """An Electricity Maps hourly CSV and the UTC start time it is read at (None without a CSV).

    ``--start`` is an ISO date and time, UTC unless it carries an offset (``+05:00`` is converted).

    Raises:
        ContractError: a CSV without ``--start``, a ``--start`` that is not an ISO date and time or
            lies outside the series, or a CSV the library refuses (:mod:`mindpipe.simulator.carbon`).
    """
    if csv is None:
        return None
    if not start:
        raise ContractError("--start", None, "--carbon-csv needs --start YYYY-MM-DDTHH:MM (UTC) of the iteration")
    from mindpipe.simulator.carbon import load_carbon_csv, parse_time

    when = parse_time(start, "--start", "")
    series = load_carbon_csv(csv)
    series.check_covers(when)  # before any work; the whole iteration's span is checked once it is known
    return series, when


def carbon_window(csv: str, window: str) -> tuple[CarbonSeries, Window]:
    """An Electricity Maps hourly CSV and the ``--window START/END`` a job may start in (``tune``).

    Raises:
        ContractError: a window that is not ``START/END`` or ends before it starts (checked before the
            file is read), a CSV the library refuses, or a window outside the series.
    """
    from mindpipe.simulator.carbon import load_carbon_csv
    from mindpipe.simulator.timeshift import parse_window

    parsed = parse_window(window)
    series = load_carbon_csv(csv)
    series.check_covers(parsed.start, (parsed.end - parsed.start).total_seconds())
    return series, parsed


def nemo_rows(path: str) -> list[NemoRow]:
    """NVIDIA's NeMo 24.07 DGX-H100 FP8 table (:func:`mindpipe.simulator.perf.nemo.load_nemo`).

    Raises:
        ContractError: the file does not parse (naming the line and the column).
    """
    from mindpipe.simulator.perf.nemo import load_nemo

    return load_nemo(path)


def vtrain_rows(path: str, dataset: VTrainDataset) -> list[VTrainRow]:
    """vTrain's published runs (``ground_truth_{single,multi}.csv``), refused if it is the other file.

    Raises:
        ContractError: the file does not parse, or holds vTrain's other dataset.
    """
    from mindpipe.simulator.perf.vtrain import load_vtrain

    rows = load_vtrain(path)
    multi = rows[0].stated_params_billion is not None
    if multi != (dataset == "vtrain-multi"):
        found = "multi-node" if multi else "single-node"
        raise ContractError(path, "line 1", f"this is vTrain's {found} file; dataset {dataset} expects the other")
    return rows


__all__ = ["HourlyIntensity", "VTrainDataset", "calibration", "carbon", "carbon_window", "cluster", "measured_runs", "model", "plan",
           "trace", "vtrain_rows"]
