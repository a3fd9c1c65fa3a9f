"""The closed loop on this machine's CPU: profile → tune → run → calibrate → re-tune → run → report.

``mindpipe demo`` (and ``make demo``) runs it for ``gpt-tiny-8k`` on 2 CPU ranks, one per core of
the CI machine. The model's 8k-entry LM head outweighs its four blocks, so the
default plan — torchtitan's defaults: a pipeline over every rank, an even split of the blocks,
``1f1b``, micro-batch 1 — leaves the rank with the LM head doing most of the work, while the
plans a tuner weighs differ by more than this machine's run-to-run drift.

1. **profile** the model layer by layer (:mod:`mindpipe.traces.profiler`);
2. **tune** every plan for the ranks with the simulator on the profiled trace (uncalibrated);
3. **run** the default plan and calibration probes (data parallelism replicated and sharded, tensor
   parallelism, the smallest and largest micro-batches data parallelism can use, and a split
   backward's stages of one and three blocks: what the executor's costs on this CPU depend on — at
   micro-batch 8 the LM head's logits are 32 MiB, which the CPU allocator maps fresh each time,
   :mod:`mindpipe.simulator.calibrate.models`; torch's zero-bubble I and W do host work of their
   own, :func:`mindpipe.simulator.build.split_backward_walks`) with the executor, in ``rounds``
   interleaved rounds;
4. **calibrate** the simulator on every round of those runs (:mod:`mindpipe.simulator.calibrate`);
5. **re-tune** with the calibrated simulator, then run its choice, the fastest plan of step 3, plans
   held out of the fit, and the default again, in ``rounds`` interleaved rounds (the speedup and the
   regret compare plans measured side by side, never minutes apart);
6. **report** (:mod:`mindpipe.loop_report`): the tuned plan's measured speedup over the default with
   both plans' round ranges, the tuner's regret (its pick's measured time over the fastest plan run
   beside it), the simulator's error before and after calibration on the held-out plans, and
   measured vs simulated Gantt charts.

Every figure in the report is measured or simulated in this run; nothing is copied in. Every file
goes under ``out``.
"""

from __future__ import annotations

import math
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mindpipe.runs import RunSpec, run_plan
from mindpipe.simulator.calibrate.fidelity import FidelitySummary, plan_label
from mindpipe.simulator.calibrate.fit import calibrate
from mindpipe.simulator.calibrate.runs import MeasuredRun, load_run, merge_repeats
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.calibration import Calibration, save_calibration
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.schema import to_dict
from mindpipe.traces.trace import Trace
from mindpipe.traces.units import plural


def demo_plan(**kw: Any) -> Plan:
    """A plan of the demo: fp32 (bf16 matmuls on this CPU are no faster end to end)."""
    return Plan(**{"precision": "fp32", "global_batch_size": 8, **kw})


@dataclass
class LoopConfig:
    """What the loop runs.

    Attributes:
        model: Built-in name or model file.
        ranks: CPU ranks (one node); one per core measures plans apart from the machine's drift.
        global_batch: Samples per iteration (every plan).
        micro_batch: The default plan's micro-batch size: 1, torchtitan's default
            (``pipeline_parallel_microbatch_size``), as a user who does not tune gets.
        profile_micro_batch: Micro-batch size the model is profiled at.
        rounds: Interleaved rounds each measured plan runs (its time is the median, its range shown).
        run: Steps, warm-up and profiling of each executor run.
        probes: Plans run for the calibration besides the default.
        holdout: Plans run only to check the calibrated predictions.
        out: Output directory; nothing is written outside it.
    """

    model: str = "gpt-tiny-8k"
    ranks: int = 2
    global_batch: int = 16
    micro_batch: int = 1
    profile_micro_batch: int = 4
    rounds: int = 3
    run: RunSpec = field(default_factory=lambda: RunSpec(steps=8, warmup_steps=2))
    probes: list[Plan] = field(default_factory=lambda: [demo_plan(dp=2, micro_batch_size=2),
                                                        demo_plan(dp=2, micro_batch_size=8, global_batch_size=16),
                                                        demo_plan(dp=2, micro_batch_size=4, zero_stage=1),
                                                        demo_plan(tp=2, micro_batch_size=4),
                                                        demo_plan(pp=2, micro_batch_size=2, schedule="zb_h1",
                                                                  partition=[1, 3]),
                                                        demo_plan(pp=2, micro_batch_size=2, schedule="zb_h1",
                                                                  partition=[3, 1])])
    holdout: list[Plan] = field(default_factory=lambda: [demo_plan(pp=2, micro_batch_size=2, schedule="zb_h1")])
    out: Path = Path("results")

    def __post_init__(self) -> None:
        for key in ("ranks", "global_batch", "micro_batch", "profile_micro_batch", "rounds"):
            if getattr(self, key) < 1:
                raise ContractError("demo", key, f"{key}={getattr(self, key)} must be >= 1")
        # Every plan the loop will run is built now, so a batch that one of them cannot split is
        # refused before anything is profiled, tuned or trained.
        fixed = [*self.probes, *self.holdout]
        multiple = math.lcm(self.micro_batch, *(p.micro_batch_size * p.dp * p.cp for p in fixed))
        try:
            self.default_plan()
            for p in fixed:
                self.at_batch(p)
        except ContractError as e:
            raise ContractError("--global-batch", None, f"{self.global_batch}: the demo's plans need a multiple of "
                                                        f"{multiple} samples ({e.rule})") from None

    def at_batch(self, plan: Plan) -> Plan:
        """``plan`` at this loop's global batch (the others' plans are written for 8 samples)."""
        return Plan(**{**{k: v for k, v in to_dict(plan).items() if k != "made_for"},
                       "global_batch_size": self.global_batch})

    def default_plan(self) -> Plan:
        """torchtitan's defaults: a pipeline over every rank, even split, ``1f1b``, micro-batch 1."""
        return demo_plan(pp=self.ranks, micro_batch_size=self.micro_batch, global_batch_size=self.global_batch)


@dataclass
class Measured:
    """Every run of the loop, by plan, in the order they ran."""

    out: Path
    model: Model
    spec: RunSpec
    say: Callable[[str], None]
    runs: dict[str, list[MeasuredRun]] = field(default_factory=dict)
    plans: dict[str, Plan] = field(default_factory=dict)

    @staticmethod
    def key(plan: Plan) -> str:
        """A plan's identity (its label covers every key the demo varies)."""
        return plan_label(plan)

    def measure(self, plans: list[Plan], rounds: int) -> None:
        """Run ``plans`` in ``rounds`` interleaved rounds (plan 1, plan 2, …, plan 1, plan 2, …)."""
        for rnd in range(rounds):
            for plan in plans:
                k = self.key(plan)
                self.plans[k] = plan
                n = len(self.runs.setdefault(k, []))
                name = re.sub(r"[^A-Za-z0-9._-]+", "_", k).strip("_")
                path = self.out / "measured" / f"{name}.run{n + 1}.json"
                self.say(f"   round {rnd + 1}/{rounds}: {k} on {plan.world_size} CPU ranks")
                run_plan(plan, self.model, path, self.spec)
                self.runs[k].append(load_run(path))

    def combined(self, plan: Plan, first: int | None = None) -> MeasuredRun:
        """The plan's runs as one (the median of their iteration times); only its ``first`` runs
        when given (a fitted plan's calibration rounds, without the rounds run after the fit)."""
        return merge_repeats(self.runs[self.key(plan)][:first])[0]

    def times(self, plan: Plan) -> list[float]:
        """Iteration seconds of each of the plan's runs, in order."""
        return [r.iteration_s for r in self.runs[self.key(plan)]]


@dataclass
class LoopResult:
    """Where everything went and the headline figures."""

    report: Path
    default_s: float
    tuned_s: float
    speedup: float
    ranges_overlap: bool
    regret: float
    holdout: FidelitySummary
    calibration: Calibration


def _tune(model: Model, cfg: LoopConfig, out: Path, trace: Trace | None,
          calibration: Calibration | None) -> tuple[Plan, int]:
    """The best plan and how many plans were simulated."""
    from mindpipe.tuner.api import tune
    from mindpipe.tuner.sweep import SweepConfig

    # The space of a few ranks is small (hundreds of plans): search it exhaustively, in fp32 (bf16
    # matmuls on this CPU are no faster end to end). What-if knobs stay at what the executor runs.
    outcome = tune(model, load_cluster(f"cpu:1x{cfg.ranks}"), out=out, global_batch=cfg.global_batch,
                   fixes=["precision=fp32"], trace=trace, calibration=calibration,
                   config=SweepConfig(optimizer="grid", budget=100_000, workers=1), plots=True)
    best = outcome.result.best
    if best is None or best.plan is None:  # tune raises NoFeasiblePlan first; kept for the type checker
        raise ContractError("demo", None, "the tuner found no feasible plan")
    return cfg.at_batch(best.plan), outcome.summary.evaluations


def closed_loop(cfg: LoopConfig, log: Callable[[str], None] | None = None) -> LoopResult:
    """Run the loop (module docstring) and write ``cfg.out / report.md``."""
    from mindpipe.loop_report import LoopFacts, write_report

    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    t_start = time.perf_counter()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model = load_model(cfg.model)

    def step(msg: str) -> None:
        say(f"[{time.perf_counter() - t_start:5.0f} s] {msg}")

    step(f"1/6 profiling {model.label} on the CPU")
    from mindpipe.traces.profiler import ProfileOptions, profile_model

    trace = profile_model(model, ProfileOptions(micro_batch_size=cfg.profile_micro_batch, repeats=5, step_repeats=0),
                          command="mindpipe demo")
    trace_path = out / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', model.label)}.trace.json"
    trace.save(trace_path)

    step("2/6 tuning (uncalibrated: profiled layer times, dedicated devices)")
    tuned1, simulated = _tune(model, cfg, out / "tune-uncalibrated", trace, None)
    default = cfg.default_plan()
    runs = Measured(out, model, cfg.run, step)

    def unique(plans: list[Plan]) -> list[Plan]:
        return list({Measured.key(p): p for p in plans}.values())

    fit_plans = unique([default] + [cfg.at_batch(p) for p in cfg.probes])
    step(f"3/6 running the default plan and {len(fit_plans) - 1} calibration probes, {cfg.rounds} rounds each")
    runs.measure(fit_plans, cfg.rounds)

    step(f"4/6 calibrating on {plural(len(fit_plans), 'plan')} ({plural(cfg.rounds, 'round')} each)")
    cal, notes = calibrate([run for p in fit_plans for run in runs.runs[Measured.key(p)]])
    save_calibration(cal, out / "calibration.json")
    for w in notes.warnings:
        say(f"   warning: {w}")

    step("5/6 re-tuning with the calibrated simulator; running its plan, the fastest plan so far, the held-out "
         "plans and the default again")
    tuned2, _ = _tune(model, cfg, out / "tune-calibrated", None, cal)
    # The regret compares the tuner's pick with the fastest plan measured so far in rounds run side
    # by side with it, never with rounds minutes apart.
    rival = min(fit_plans, key=lambda p: statistics.median(runs.times(p)))
    side_by_side = unique([default, tuned2, rival] + [cfg.at_batch(p) for p in cfg.holdout])
    runs.measure(side_by_side, cfg.rounds)
    held = [p for p in side_by_side if Measured.key(p) not in {Measured.key(q) for q in fit_plans}]

    step("6/6 writing the report")
    facts = LoopFacts(cfg=cfg, model=model, trace=trace, trace_file=trace_path.name, simulated=simulated,
                      default=default, tuned1=tuned1, tuned2=tuned2, fit_plans=fit_plans, held_plans=held,
                      side_by_side=side_by_side, calibration=cal, warnings=list(notes.warnings))
    res = write_report(facts, runs)
    step(f"done: {res.report}")
    return res


__all__ = ["LoopConfig", "LoopResult", "Measured", "closed_loop", "demo_plan"]
