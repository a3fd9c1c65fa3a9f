"""GPU power and time as functions of the SM clock: the one owner of the frequency model.

**Time.** A kernel's compute part scales as f_max/f (tensor-core throughput is proportional to
the SM clock), its memory part (HBM traffic, memory clock left at max, as Perseus and Zeus lock
only the graphics clock) does not, and the two combine by the roofline rule the compute model
already uses per kernel (:mod:`mindpipe.simulator.perf.kernels`: max of compute and memory time,
plus a fixed overhead). So a stage's time at clock f is what the hardware compute model gives
for a device whose peak FLOP/s is scaled by f/f_max: :func:`clocked_device`. Trace-driven and
calibrated models are stretched by the hardware model's ratio T(f)/T(f_max), phase by phase.

**Power.** P(f, ρ) = P_blk + (P_max − P_blk)·[ρ·g(f) + (1 − ρ)·μ·(h + (1 − h)·g(f))], where ρ is
the share of the action's time spent in compute-bound kernels, μ the dynamic power of a
memory-bound kernel relative to a GEMM's, h the part of it in HBM (not scaled by the SM clock), and
g(f) = (f/f_max)·(V(f)/V_max)² the CMOS dynamic power f·V² with the voltage falling in proportion
to the clock down to the base clock and flat below it (V(f) ∝ max(f, f_base)). At f_max a GEMM
draws the board limit P_max (A100/H100 GEMM-bound training sits at the power limit); idle and
blocked ranks draw P_blk, Perseus's "blocked on P2P" power. Constants: ``traces/hardware/
frequency.json`` (μ, h and the knee are marked as estimates there). The energy of a compute-bound
kernel, P·t ∝ (P_blk + D·g(f))/f, is then U-shaped (EnvPipe, ATC'23; Perseus, SOSP'24): it falls
as f drops to the knee and rises below it, so the knee is its energy-optimal clock.

Clocks are per (virtual) stage (``stage_clocks_mhz``: :func:`apply_clocks`, :func:`rank_busy_power_w`)
or per action (``action_clocks_mhz``: :func:`apply_action_clocks` gives each
micro-batch's forward and backward its own stretch, :func:`action_busy_power_w` weights power by
each action's clocked time).

ρ of a stage phase comes from the same hardware model: write the kernels' own time K(f) = C·f_max/f + M
and solve from K(f_max) and K(f_min) (exact when every kernel stays on one side of its roofline over
the range).

**Launch-bound phases.** Eager PyTorch issues kernels from one host thread, and the hardware model
bounds each layer phase below by that issue time, which no SM clock changes
(:class:`mindpipe.simulator.perf.gpu.GpuComputeModel`). A phase's wall time is then T(f) ≥ K(f):
the GPU runs kernels K(f) of it and waits for the next launch the rest, drawing only P_blk (static
and idle power are paid for the whole wall time; only the kernels draw dynamic power). So the power
of a phase weights the dynamic terms by the shares of its wall time spent in compute-bound kernels
(C·f_max/f ÷ T) and in clock-flat kernels (M ÷ T), and the remainder is launch gaps at P_blk:
P = P_blk + (P_max − P_blk)·[ρ_c·g(f) + ρ_m·μ·(h + (1 − h)·g(f))]. Lowering the clock of a
launch-bound phase costs no time until K(f) reaches the issue time, and saves dynamic power only in
the K(f)/T share of it: on ``gpt-mini`` (kernels ≈ 4 % of an A100's wall time) a few percent, not the
~30 % that charging the whole wall time at a memory-bound kernel's power claimed. Where the issue
time never binds (every large model), K = T and nothing changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mindpipe.simulator.build import assign_layers, stage_recompute
from mindpipe.simulator.costs import ComputeModel
from mindpipe.simulator.perf import GpuComputeModel, default_models
from mindpipe.simulator.work import StageWork, StepCopies
from mindpipe.traces.catalog import DeviceSpec
from mindpipe.traces.config import Cluster, Model, Plan
from mindpipe.traces.frequency import FrequencySpec, frequency_spec
from mindpipe.traces.layout import block_policies, stage_layout

PHASES = ("forward", "backward")


@dataclass(frozen=True)
class PowerModel:
    """Board power of one GPU as a function of SM clock and load (module docstring).

    Attributes:
        spec: The device's clock data.
        max_power_W: Board power limit (catalog ``max_power_W``).
    """

    spec: FrequencySpec
    max_power_W: float

    def __post_init__(self) -> None:
        if not self.spec.blocked_power_W < self.max_power_W:
            raise ValueError(f"{self.spec.device}: blocked_power_W must be below max_power_W")

    @classmethod
    def of(cls, device: DeviceSpec) -> PowerModel:
        """The power model of a catalog device (ContractError when it has no frequency data)."""
        return cls(frequency_spec(device.name), device.max_power_W)

    @property
    def blocked_power_W(self) -> float:
        """Power while idle in an iteration or blocked on P2P (Perseus)."""
        return self.spec.blocked_power_W

    def activity(self, mhz: float) -> float:
        """g(f) = (f/f_max)·(max(f, f_base)/f_max)²: dynamic power relative to f_max."""
        fmax = self.spec.max_sm_clock_MHz
        v = max(mhz, self.spec.base_sm_clock_MHz) / fmax
        return (mhz / fmax) * v * v

    def busy_power_w(self, mhz: float, compute_share: float, kernel_share: float = 1.0) -> float:
        """Mean power of a device at ``mhz`` over a span it spends ``compute_share`` in compute-bound
        kernels and ``kernel_share`` in kernels of any kind; the rest (launch gaps) draws P_blk."""
        k = min(max(kernel_share, 0.0), 1.0)
        rho = min(max(compute_share, 0.0), k)
        g = self.activity(mhz)
        mu, h = self.spec.memory_bound_power_fraction, self.spec.memory_power_clock_independent_fraction
        dynamic = rho * g + (k - rho) * mu * (h + (1.0 - h) * g)
        return self.blocked_power_W + (self.max_power_W - self.blocked_power_W) * dynamic

    def phase_power_w(self, mhz: float, phase: PhaseAtClock) -> float:
        """Mean power of a stage phase at ``mhz`` (its shares from :class:`StageClockTable`): what every
        caller prices a clocked phase with."""
        return self.busy_power_w(mhz, phase.compute_share, phase.kernel_share)


def clocked_device(device: DeviceSpec, mhz: int, spec: FrequencySpec | None = None) -> DeviceSpec:
    """``device`` with every peak FLOP/s scaled by f/f_max (memory bandwidth unchanged)."""
    spec = spec or frequency_spec(device.name)
    k = mhz / spec.max_sm_clock_MHz
    return dataclasses.replace(device, peak_flops_per_s={d: v * k for d, v in device.peak_flops_per_s.items()})


@dataclass(frozen=True)
class PhaseAtClock:
    """One stage phase at one clock: its wall time relative to f_max, and the shares of that wall
    time the GPU spends in compute-bound kernels and in kernels at all (the rest: waiting for the
    host to launch the next one, at blocked power)."""

    stretch: float
    compute_share: float
    kernel_share: float = 1.0


def split_compute(t_max: float, t_low: float, f_max: int, f_low: int) -> tuple[float, float]:
    """(C, M) of T(f) = C·f_max/f + M from the times at f_max and f_low (C clipped to [0, T(f_max)])."""
    if t_max <= 0 or f_low >= f_max:
        return 0.0, max(t_max, 0.0)
    c = (t_low - t_max) / (f_max / f_low - 1.0)
    c = min(max(c, 0.0), t_max)
    return c, t_max - c


def phase_at_clock(t_max: float, t_f: float, compute_s: float, f_max: int, mhz: int,
                   kernel_f: float | None = None) -> PhaseAtClock:
    """Stretch T(f)/T(f_max), compute-bound share C·(f_max/f)/T(f) and kernel share K(f)/T(f) of a
    phase whose wall time is ``t_f`` and kernels' own time ``kernel_f`` (default: the wall time)."""
    if t_max <= 0:
        return PhaseAtClock(1.0, 0.0)
    if t_f <= 0:
        return PhaseAtClock(t_f / t_max, 0.0, 0.0)
    kernels = min(t_f if kernel_f is None else max(kernel_f, 0.0), t_f)
    stretched = min(compute_s * f_max / mhz, kernels)
    return PhaseAtClock(t_f / t_max, stretched / t_f, kernels / t_f)


class StageSeconds(tuple[float, float]):
    """A stage's (forward, backward) wall seconds at one clock, with ``kernel_s``: the part of each
    the GPU spends running kernels (the rest waits on the host's kernel issue; module docstring).

    A pair, so it is what the simulator caches per clock (:meth:`mindpipe.simulator.simulator.Simulator.clock_table`);
    a plain ``(forward, backward)`` pair means kernels fill the wall time.
    """

    kernel_s: tuple[float, float]

    def __new__(cls, wall: tuple[float, float], kernel: tuple[float, float] | None = None) -> StageSeconds:
        self = super().__new__(cls, (float(wall[0]), float(wall[1])))
        k = wall if kernel is None else kernel
        self.kernel_s = (min(float(k[0]), self[0]), min(float(k[1]), self[1]))
        return self

    def __getnewargs__(self) -> tuple[tuple[float, float], tuple[float, float]]:
        return (self[0], self[1]), self.kernel_s


def kernel_seconds(t: tuple[float, float]) -> tuple[float, float]:
    """The kernels' own (forward, backward) seconds of a stage's times (the wall times for a plain pair)."""
    return t.kernel_s if isinstance(t, StageSeconds) else (t[0], t[1])


@dataclass(frozen=True)
class StageClockTable:
    """Per (virtual) stage, per supported clock, the forward and backward phases' stretch and load.

    ``table[s][mhz]`` is ``(forward, backward)`` :class:`PhaseAtClock`; the backward covers
    recompute, input and weight gradients (the engine runs them as one action or as I and W).
    """

    clocks: list[int]
    table: list[dict[int, tuple[PhaseAtClock, PhaseAtClock]]]

    def at(self, stage: int, mhz: int) -> tuple[PhaseAtClock, PhaseAtClock]:
        """The stage's (forward, backward) at ``mhz``."""
        return self.table[stage][mhz]


def build_clock_table(stage_phase_s: Mapping[int, Sequence[tuple[float, float]]], f_max: int) -> StageClockTable:
    """A :class:`StageClockTable` from hardware-model stage times at each clock.

    Args:
        stage_phase_s: ``{mhz: [(forward_s, backward_s) per stage]}`` (:class:`StageSeconds`, with
            the kernels' own seconds, from :func:`hardware_stage_times`), with ``f_max`` and the
            lowest clock present (their kernel times fix each phase's compute/memory split).
        f_max: The maximum clock.
    """
    clocks = sorted(stage_phase_s, reverse=True)
    f_low = clocks[-1]
    base, low = stage_phase_s[f_max], stage_phase_s[f_low]
    table: list[dict[int, tuple[PhaseAtClock, PhaseAtClock]]] = []
    for s in range(len(base)):
        per: dict[int, tuple[PhaseAtClock, PhaseAtClock]] = {}
        k_max, k_low = kernel_seconds(base[s]), kernel_seconds(low[s])
        splits = [split_compute(k_max[k], k_low[k], f_max, f_low)[0] for k in range(2)]
        for mhz in clocks:
            t = stage_phase_s[mhz][s]
            kt = kernel_seconds(t)
            fwd, bwd = (phase_at_clock(base[s][k], t[k], splits[k], f_max, mhz, kt[k]) for k in range(2))
            per[mhz] = (fwd, bwd)
        table.append(per)
    return StageClockTable(clocks, table)


def _stage_sums(compute: ComputeModel, model: Model, plan: Plan) -> list[tuple[float, float]]:
    """(forward, backward) seconds per stage of ``compute``'s layer costs; the backward is recompute +
    input gradient + weight gradient, summed by the owners of the stage layout and the recompute
    rule (:mod:`mindpipe.simulator.build`)."""
    stages = assign_layers(compute.layer_costs(model, plan), model, plan)
    policies = block_policies(plan, model.num_layers)
    spans = stage_layout(plan, model)
    out = []
    for s, layers in enumerate(stages):
        recompute, _, _ = stage_recompute(layers, [policies[b] for b in spans[s].blocks])
        out.append((sum(c.forward_s for c in layers),
                     recompute + sum(c.backward_input_s + c.backward_weight_s for c in layers)))
    return out


def hardware_stage_times(model: Model, plan: Plan, device: DeviceSpec, cluster: Cluster, mhz: int,
                         spec: FrequencySpec) -> list[tuple[float, float]]:
    """(forward, backward) compute seconds per stage on the hardware model at clock ``mhz``, as
    :class:`StageSeconds`: the wall time (the host's kernel issue bound included) and the kernels'
    own time (the same model without that bound)."""
    compute = default_models(clocked_device(device, mhz, spec), cluster)[0]
    wall = _stage_sums(compute, model, plan)
    kernels = wall
    if isinstance(compute, GpuComputeModel) and compute.host_bound:
        kernels = _stage_sums(dataclasses.replace(compute, host_bound=False), model, plan)
    out: list[tuple[float, float]] = [StageSeconds(w, k) for w, k in zip(wall, kernels, strict=True)]
    return out


def apply_clocks(stages: list[StageWork], table: StageClockTable, clocks: Sequence[int]) -> None:
    """Stretch each stage's compute to its clock (in place): forward by the forward phase's
    stretch, recompute, input and weight gradients by the backward's, and the GEMMs its TP
    collectives overlap with (``tp_comm_overlap``) by their pass's."""
    for s, st in enumerate(stages):
        fwd, bwd = table.at(s, clocks[s])
        st.forward_s *= fwd.stretch
        st.recompute_s *= bwd.stretch
        st.input_s *= bwd.stretch
        st.weight_s *= bwd.stretch
        st.weight_rerun_s *= bwd.stretch
        st.fwd_tp_overlap = [dataclasses.replace(o, gemm_s=o.gemm_s * fwd.stretch) for o in st.fwd_tp_overlap]
        st.bwd_tp_overlap = [dataclasses.replace(o, gemm_s=o.gemm_s * bwd.stretch) for o in st.bwd_tp_overlap]


def rank_busy_power_w(stages: list[StageWork], table: StageClockTable, clocks: Sequence[int], stage_to_rank: list[int],
                      power: PowerModel, pp: int, num_microbatches: int = 1,
                      copies: StepCopies | None = None) -> list[float]:
    """Each rank's mean power while computing: its stages' phases over a step of ``num_microbatches``
    weighted by their (clocked) time, and the data-parallel wrapper's ``copies`` (memory-bound:
    compute share 0, unstretched) at the stage's clock."""
    energy, seconds = [0.0] * pp, [0.0] * pp
    for s, st in enumerate(stages):
        r = stage_to_rank[s]
        fwd, bwd = table.at(s, clocks[s])
        for t, ph in ((st.forward_s, fwd), (st.backward_compute_s, bwd)):
            energy[r] += power.phase_power_w(clocks[s], ph) * t * num_microbatches
            seconds[r] += t * num_microbatches
        c = copies.stage_total[s] if copies is not None else 0.0
        energy[r] += power.busy_power_w(clocks[s], 0.0) * c
        seconds[r] += c
    return [e / t if t > 0 else power.max_power_W for e, t in zip(energy, seconds, strict=True)]


def apply_action_clocks(stages: list[StageWork], table: StageClockTable, action_clocks: Sequence[Sequence[Sequence[int]]]) -> None:
    """Give each stage per micro-batch stretches from ``action_clocks_mhz`` (in place; the stage
    times stay those at f_max): ``action_clocks[s][0][mb]`` clocks micro-batch ``mb``'s forward,
    ``[1][mb]`` its recompute, input and weight gradients."""
    for s, st in enumerate(stages):
        fwd, bwd = action_clocks[s]
        st.mb_stretch = [(table.at(s, f)[0].stretch, table.at(s, b)[1].stretch) for f, b in zip(fwd, bwd, strict=True)]


def action_busy_power_w(stages: list[StageWork], table: StageClockTable, action_clocks: Sequence[Sequence[Sequence[int]]],
                        stage_to_rank: list[int], power: PowerModel, pp: int,
                        copies: StepCopies | None = None) -> list[float]:
    """Each rank's mean power while computing under per-action clocks (stages at f_max, as
    :func:`apply_action_clocks` leaves them), every action weighted by its clocked time, and each of
    the data-parallel wrapper's ``copies`` at its action's clock (the one after the rank's last
    action at the clock of the stage's last backward)."""
    energy, seconds = [0.0] * pp, [0.0] * pp
    for s, st in enumerate(stages):
        r = stage_to_rank[s]
        back = st.backward_compute_s
        for k, row in enumerate(action_clocks[s]):
            base = st.forward_s if k == 0 else back
            for mhz in row:
                ph = table.at(s, mhz)[k]
                energy[r] += power.phase_power_w(mhz, ph) * base * ph.stretch
                seconds[r] += base * ph.stretch
    if copies is not None:
        clocked = [((kind, s, mb), t) for (kind, s, mb), t in copies.in_action.items()]
        clocked += [(("B", s, mb), t) for s, (t, mb) in enumerate(copies.after)]
        for (kind, s, mb), t in clocked:
            mhz = action_clocks[s][0 if kind == "F" else 1][mb]
            energy[stage_to_rank[s]] += power.busy_power_w(mhz, 0.0) * t
            seconds[stage_to_rank[s]] += t
    return [e / t if t > 0 else power.max_power_W for e, t in zip(energy, seconds, strict=True)]


__all__ = [
    "PHASES",
    "PhaseAtClock",
    "PowerModel",
    "StageClockTable",
    "StageSeconds",
    "action_busy_power_w",
    "apply_action_clocks",
    "apply_clocks",
    "build_clock_table",
    "clocked_device",
    "hardware_stage_times",
    "kernel_seconds",
    "phase_at_clock",
    "rank_busy_power_w",
    "split_compute",
]
