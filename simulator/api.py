"""``simulate(model, cluster, plan)``: one plan, one call (the ``simulate`` contract).

A thin wrapper around :class:`mindpipe.simulator.simulator.Simulator`, which owns the device,
compute and communication models, the calibration and the memory model. Code that simulates many
plans of one (model, cluster) — the tuner, calibration, the demo — builds a ``Simulator`` once and
calls :meth:`~mindpipe.simulator.simulator.Simulator.run` per plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from mindpipe.simulator.carbon import Hourly
from mindpipe.simulator.costs import CommModel, ComputeModel
from mindpipe.simulator.perf import default_models
from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.builtin import Arg, load_cluster, load_model, load_plan
from mindpipe.traces.calibration import Calibration
from mindpipe.traces.catalog import DeviceSpec
from mindpipe.traces.config import Cluster, Model, Plan
from mindpipe.traces.result import SimulationResult
from mindpipe.traces.trace import Trace


@dataclass
class SimulationOptions:
    """Optional inputs of :func:`simulate` (see :class:`~mindpipe.simulator.simulator.Simulator`).

    Attributes:
        trace: Per-layer costs to use instead of the hardware model.
        compute: A compute model (overrides ``trace`` and the default).
        comm: A communication model (default: the device's fitted or α-β model).
        timeline: Return every compute action and transfer in ``result.timeline``.
        cores_per_rank_slots: CPU ranks sharing cores (see EngineOptions); from calibration.
        step_overhead_s: Host time per iteration outside the schedule (see EngineOptions).
        hourly_intensity: An Electricity Maps hourly series and the start time of the iteration,
            instead of the region's annual mean.
        catalog: A device catalog to look the cluster's device up in (default: shipped).
        calibration: Constants fitted from measured runs (``mindpipe calibrate``).
    """

    trace: Trace | None = None
    compute: ComputeModel | None = None
    comm: CommModel | None = None
    timeline: bool = False
    cores_per_rank_slots: float | None = None
    step_overhead_s: float = 0.0
    hourly_intensity: Hourly | None = None
    catalog: dict[str, DeviceSpec] | None = None
    calibration: Calibration | None = None

    def simulator(self, model: Model, cluster: Cluster) -> Simulator:
        """The :class:`Simulator` these options describe."""
        return Simulator(model, cluster, trace=self.trace, calibration=self.calibration, compute=self.compute,
                         comm=self.comm, catalog=self.catalog, cores_per_rank_slots=self.cores_per_rank_slots,
                         step_overhead_s=self.step_overhead_s)


def simulate(model: Model | Arg, cluster: Cluster | Arg, plan: Plan | Arg,
             options: SimulationOptions | None = None) -> SimulationResult:
    """Predict one training iteration of ``model`` on ``cluster`` under ``plan``.

    Each may be its object or what the CLI takes for it (``"gpt-13b"``, ``"a100-sxm4-80gb:8x8"``, a
    file, JSON text) or a dict (:func:`mindpipe.traces.builtin.load_model` and its siblings).

    Raises:
        ContractError: an argument names nothing, or the plan does not fit the model or the cluster
            (names key and rule).
    """
    opts = options or SimulationOptions()
    return opts.simulator(load_model(model), load_cluster(cluster)).run(load_plan(plan), timeline=opts.timeline,
                                                                        hourly=opts.hourly_intensity)


__all__ = ["SimulationOptions", "Simulator", "default_models", "simulate"]
