"""The sweep loop: ask the searcher, evaluate in parallel, store every result, tell, repeat.

Evaluations run through a :class:`concurrent.futures.Executor`: in-process for one worker, a
local process pool (spawned, so it is safe under pytest and threads) by default, or a Dask
cluster's executor (``dask.distributed.Client(address).get_executor()``) for sweeps that outgrow
one machine. The loop is batch-synchronous — it asks a batch, waits for all of it, then tells the
searcher in ask order — so the sequence of proposals depends only on the seed and the results,
never on which worker finished first. That is what makes resuming exact: a resumed sweep replays
the same search and takes results already in the store instead of evaluating them again.

``budget`` counts simulations (evaluations that ran the event simulator, or tried to and failed
with an error — a simulator bug must not let a sweep run through its whole space); points
rejected by the memory check before simulating cost no budget but are counted as infeasible.
The memory check runs here, in the searcher's process, as the searcher picks (``screen``): a point
it refuses is stored and told at once with the record the evaluation would have made, and never
goes to a worker, so a space where most plans cannot fit costs milliseconds per such plan, not a
round of proposals and evaluations.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import multiprocessing.context
import os
import signal
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from typing import Any

from mindpipe.traces.errors import ContractError
from mindpipe.traces.processes import die_with_parent
from mindpipe.tuner.evaluate import evaluate
from mindpipe.tuner.evaluate import screen as screen_memory
from mindpipe.tuner.keys import CLI_ARG_NAMES, PYTHON_ARG_NAMES, ArgNames, Point, point_key
from mindpipe.tuner.materialize import Problem
from mindpipe.tuner.objectives import Objective
from mindpipe.tuner.optimizers import OPTIMIZERS, Searcher, make_searcher
from mindpipe.tuner.records import EvaluationRecord, MemoryCode, ScoredRecord, Status, Verdict
from mindpipe.tuner.space import SearchSpace
from mindpipe.tuner.store import SweepStore

Evaluator = Callable[[Problem, dict[str, Any]], EvaluationRecord]
Screener = Callable[[Problem, dict[str, Any]], EvaluationRecord | None]
Progress = Callable[[int, int, float | None], None]


@dataclass
class SweepConfig:
    """How to search.

    Attributes:
        optimizer: ``bo``, ``random`` or ``grid``.
        budget: Most simulations to run.
        seed: Seed of every random choice.
        surrogate: ``gp``, ``rf`` or ``et`` (``bo`` only).
        n_initial: Random proposals before the surrogate takes over (``bo`` only).
        workers: Parallel evaluations (local processes; 1 = in this process).
        dask: Address of a Dask scheduler; evaluations go there instead.
        batch_size: Proposals per round (default: ``workers``).
        dask_timeout_s: How long to wait for the Dask scheduler before giving up.
        arg_names: How a refusal names the fields (not kept): as :func:`~mindpipe.tuner.api.tune`
            calls them (``config.budget``, the default), or as ``mindpipe tune``'s flags
            (:data:`~mindpipe.tuner.keys.CLI_ARG_NAMES`, which the CLI passes).
    """

    optimizer: str = "bo"
    budget: int = 60
    seed: int = 0
    surrogate: str = "gp"
    n_initial: int = 10
    workers: int = 2
    dask: str | None = None
    batch_size: int | None = None
    dask_timeout_s: float = 30.0
    arg_names: InitVar[ArgNames] = PYTHON_ARG_NAMES

    def __post_init__(self, arg_names: ArgNames) -> None:
        n = arg_names
        if self.optimizer not in OPTIMIZERS:
            raise ContractError(n.name("--optimizer"), None, f"{self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        for flag, count in (("--budget", self.budget), ("--workers", self.workers), ("--batch-size", self.batch_size)):
            if count is not None and count < 1:
                raise ContractError(n.name(flag), None, f"{n.given(flag, count)} must be >= 1")

    def identity(self) -> dict[str, Any]:
        """What must match to resume (the budget and the executor may change).

        ``bo``'s proposals depend on how they were batched (a batch is chosen before its results
        are known), so a resumed ``bo`` sweep must keep the batch size — ``--batch-size``, or
        ``--workers`` when that is not given — to replay the same search; grid and random orders
        do not depend on it.
        """
        out: dict[str, Any] = {"optimizer": self.optimizer, "seed": self.seed, "surrogate": self.surrogate,
                               "n_initial": self.n_initial}
        if self.optimizer == "bo":
            out["batch_size"] = self.batch_size or self.workers
        return out


@dataclass
class SweepResult:
    """Every evaluation of a sweep, scored under the objective, and the tallies.

    Attributes:
        records: Every evaluation, in proposal order (a notebook shows the best).
        best: The best feasible one, if any.
        simulations: Evaluations that cost budget (simulated, or failed trying: module docstring).
        reused: Records taken from the store of a previous run.
        infeasible: Infeasible records per verdict.
        refused: Those of ``infeasible`` refused before simulating, at no budget: the memory
            estimate's ``out_of_memory``, a plan rule the evaluation found (``invalid``). The rest
            (:attr:`simulated_infeasible`) were simulations.
    """

    records: list[ScoredRecord] = field(repr=False)
    best: ScoredRecord | None
    simulations: int
    reused: int
    infeasible: Counter[Verdict] = field(default_factory=Counter)
    refused: Counter[Verdict] = field(default_factory=Counter)

    @property
    def simulated_infeasible(self) -> Counter[Verdict]:
        """Infeasible records per verdict among the simulations (out of memory at the simulated peak,
        over a constraint, without a value, or failed)."""
        return self.infeasible - self.refused


_VERDICT_OF_STATUS = {Status.OUT_OF_MEMORY: Verdict.OUT_OF_MEMORY, Status.INVALID: Verdict.INVALID,
                      Status.ERROR: Verdict.ERROR}


def annotate(record: EvaluationRecord, objective: Objective, index: int = -1) -> ScoredRecord:
    """An evaluation under ``objective``: derived metrics, value, loss and verdict."""
    metrics = objective.derive(record.metrics, record.point["global_batch_size"])
    if record.status is not Status.OK:
        return ScoredRecord(record, metrics, _VERDICT_OF_STATUS[record.status], index=index)
    if not record.simulated:
        return ScoredRecord(record, metrics, Verdict.NO_VALUE, index=index)
    value = objective.value(metrics)
    if value is None:
        return ScoredRecord(record, metrics, Verdict.NO_VALUE, index=index)
    broken = objective.violated(metrics)
    if broken:
        return ScoredRecord(record, metrics, Verdict.CONSTRAINT, value, broken=broken, index=index)
    return ScoredRecord(record, metrics, Verdict.FEASIBLE, value, objective.loss(value), index=index)


def _value(record: ScoredRecord) -> float:
    """A feasible record's objective value (:func:`annotate` gives every feasible record one)."""
    if record.value is None:
        raise RuntimeError(f"feasible record {record.key} has no value")
    return record.value


class _InlineExecutor(cf.Executor):
    """Runs each task at submit time, in this process (one worker, no pickling)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        fut: cf.Future[Any] = cf.Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as e:
            fut.set_exception(e)
        return fut


def _worker_start(parent: int) -> None:
    """A pool worker's first act: leave Ctrl-C to the sweep (the terminal sends SIGINT to the whole
    process group; the sweep stops its workers itself, without a traceback from each), and die
    with the sweep if it is killed outright."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent)


class _SpawnIgnoringCtrlC(multiprocessing.context.SpawnProcess):
    """A spawned pool worker that ignores SIGINT from its first instruction, not only from the pool's
    initializer on: the terminal sends Ctrl-C to the whole process group, and a worker still
    importing in ``spawn_main`` printed a KeyboardInterrupt traceback. An ignored signal stays
    ignored across exec (and Python keeps it so), so the sweep ignores SIGINT for the instant of the
    spawn itself, in the main thread, where the pool starts its workers."""

    def start(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            super().start()
            return
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            super().start()
        finally:
            signal.signal(signal.SIGINT, old)


class _SpawnContext(multiprocessing.context.SpawnContext):
    Process = _SpawnIgnoringCtrlC


def _stop_pool(pool: cf.ProcessPoolExecutor, abort: bool) -> None:
    """Release the pool: wait for its workers, or, when the sweep is interrupted, end them now
    (an evaluation under way is lost; every finished one is in the store)."""
    if not abort:
        pool.shutdown(wait=True, cancel_futures=True)
        return
    workers = list((getattr(pool, "_processes", None) or {}).values())  # Python < 3.14: no terminate_workers()
    manager = getattr(pool, "_executor_manager_thread", None)  # shutdown() forgets it
    pool.shutdown(wait=False, cancel_futures=True)
    for w in workers:
        w.terminate()
    for w in workers:
        w.join(timeout=10)
    # The pool's manager thread closes its wake-up pipe as it sees the workers gone, and at exit
    # Python wakes every manager thread through that pipe; until CPython gh-125451 (3.12.8, 3.13.1;
    # not in 3.11) nothing kept the two apart, so a thread still closing as the sweep exited could
    # raise "Bad file descriptor" in threading's shutdown: a traceback after the one-line stop
    # message (seen once in CI under load). Wait for it here instead.
    if manager is not None:
        manager.join(timeout=10)


def open_executor(cfg: SweepConfig) -> tuple[cf.Executor, Callable[[bool], None]]:
    """The executor for ``cfg`` and a function that releases it (``True``: the sweep was
    interrupted, so local workers are stopped rather than waited for)."""
    if cfg.dask:
        try:
            from dask.distributed import Client
        except ImportError:  # pragma: no cover - dask[distributed] is a dependency
            raise ContractError("--dask", None, "dask.distributed is not installed") from None
        try:
            client = Client(cfg.dask, timeout=cfg.dask_timeout_s)
        except OSError as e:
            raise ContractError("--dask", None, f"cannot reach the Dask scheduler at {cfg.dask}: {e}") from None
        ex = client.get_executor(pure=False)

        def close_dask(abort: bool) -> None:
            ex.shutdown(wait=not abort)
            client.close()

        return ex, close_dask
    if cfg.workers == 1:
        inline = _InlineExecutor()
        return inline, lambda abort: None
    pool = cf.ProcessPoolExecutor(max_workers=cfg.workers, mp_context=_SpawnContext(),
                                  initializer=_worker_start, initargs=(os.getpid(),))
    return pool, lambda abort: _stop_pool(pool, abort)


def run_sweep(problem: Problem, space: SearchSpace, objective: Objective, cfg: SweepConfig, store: SweepStore,
              *, progress: Progress | None = None, evaluator: Evaluator = evaluate,
              screen: Screener | None = screen_memory, arg_names: ArgNames = CLI_ARG_NAMES) -> SweepResult:
    """Search ``space`` for the best plan under ``objective``.

    Args:
        problem: Model, cluster and trace, shipped to every evaluation.
        space: The enumerated valid points.
        objective: What to optimise and the constraints.
        cfg: Optimizer, budget, seed, parallelism.
        store: Where results are persisted (and found again on resume).
        progress: Called after every finished evaluation with (simulations, budget, best value).
        evaluator: The evaluation function (default :func:`mindpipe.tuner.evaluate.evaluate`); must be
            picklable for process and Dask executors.
        screen: Run here, before a point is proposed: the record of a point that cannot fit
            (default :func:`mindpipe.tuner.evaluate.screen`, the memory model's refusal, without
            simulating), or None. Refused points are stored and told as the evaluator's would be,
            without a round of proposals and evaluations each; None turns it off (an evaluator
            that replays recorded results must).
        arg_names: How a refusal names the arguments (``mindpipe tune``'s flags by default;
            :func:`~mindpipe.tuner.api.tune` passes its own).

    Raises:
        ContractError: an empty space, or ``grid`` over more points than the budget.
    """
    points = space.points
    if not points:
        raise ContractError("tune", None, no_plan_message(space, arg_names))
    if cfg.optimizer == "grid" and len(points) > cfg.budget:
        budget = arg_names.name("--budget")
        raise ContractError(budget, None, f"grid search would simulate up to {len(points)} plans, more than "
                            f"{arg_names.given('--budget', cfg.budget)}: raise {budget} or narrow the space with "
                            f"{arg_names.name('--fix')}")
    searcher = make_searcher(cfg.optimizer, points, cfg.seed, surrogate=cfg.surrogate, n_initial=cfg.n_initial)
    batch_size = cfg.batch_size or cfg.workers
    sweep = _Sweep(problem, points, objective, cfg, store, evaluator, progress)
    refuse = sweep.refuse_with(screen) if screen is not None else None
    try:
        while sweep.simulations < cfg.budget:
            batch = searcher.ask(min(batch_size, cfg.budget - sweep.simulations), refuse)
            walked = sweep.tell_refused(searcher)
            if not batch:
                if walked:  # a walk past refused points ended the ask: ask again
                    continue
                break
            done = sweep.evaluate(batch)
            searcher.tell(batch, sweep.record(batch, done))
    except BaseException:  # Ctrl-C, a stop signal, an evaluator's error: the workers go now
        sweep.close(True)
        raise
    sweep.close(False)
    infeasible = Counter(r.verdict for r in sweep.records if not r.feasible)
    refused = Counter(r.verdict for r in sweep.records if not r.feasible and not r.evaluation.costs_budget)
    return SweepResult(sweep.records, sweep.best, sweep.simulations, sweep.reused, infeasible, refused)


class _Sweep:
    """A sweep's state between rounds: every scored record, the best, the budget spent, the points the
    screen refused since the last round, and the executor (opened at the first evaluation)."""

    def __init__(self, problem: Problem, points: list[Point], objective: Objective, cfg: SweepConfig,
                 store: SweepStore, evaluator: Evaluator, progress: Progress | None) -> None:
        self.problem, self.points, self.objective, self.cfg = problem, points, objective, cfg
        self.store, self.evaluator, self.progress = store, evaluator, progress
        self.records: list[ScoredRecord] = []
        self.best: ScoredRecord | None = None
        self.simulations = self.reused = 0
        self.refused: list[tuple[int, EvaluationRecord]] = []
        self.executor: cf.Executor | None = None
        self.close: Callable[[bool], None] = lambda abort: None

    def refuse_with(self, check: Screener) -> Callable[[int], bool]:
        """The searcher's refusal test: a point the screen (or, on resume, the store) says cannot fit."""

        def refuse(i: int) -> bool:
            stored = self.store.get(point_key(self.points[i]))
            if stored is not None:  # a resumed sweep: the stored verdict (whoever made it) decides
                rec = stored if stored.status is Status.OUT_OF_MEMORY and stored.code is MemoryCode.ESTIMATE else None
                self.reused += rec is not None
            else:
                rec = check(self.problem, self.points[i])
                if rec is not None:
                    self.store.add(rec)
            if rec is not None:
                self.refused.append((i, rec))
            return rec is not None

        return refuse

    def tell_refused(self, searcher: Searcher) -> int:
        """Tell the searcher the points refused since the last round, in their order; how many there were."""
        walked = len(self.refused)
        if self.refused:
            told = [annotate(rec, self.objective, len(self.records) + j) for j, (_, rec) in enumerate(self.refused)]
            self.records += told
            searcher.tell([i for i, _ in self.refused], [r.loss for r in told])
            self.refused.clear()
        return walked

    def evaluate(self, batch: list[int]) -> dict[int, EvaluationRecord]:
        """Evaluate the batch (stored results are reused), showing progress as each evaluation finishes."""
        done: dict[int, EvaluationRecord] = {}
        pending: dict[cf.Future[Any], int] = {}
        for j, i in enumerate(batch):
            stored = self.store.get(point_key(self.points[i]))
            if stored is not None:
                done[j] = stored
                self.reused += 1
                continue
            if self.executor is None:
                self.executor, self.close = open_executor(self.cfg)
            pending[self.executor.submit(self.evaluator, self.problem, self.points[i])] = j
        for fut in cf.as_completed(pending):
            rec = fut.result()
            self.store.add(rec)
            done[pending[fut]] = rec
            self._show(done)
        return done

    def _show(self, done: dict[int, EvaluationRecord]) -> None:
        """Progress: simulations so far and the best value, this batch's finished results included."""
        if self.progress is None:
            return
        sims = self.simulations + sum(1 for r in done.values() if r.costs_budget)
        shown = self.best.value if self.best else None
        for r in done.values():
            ann = annotate(r, self.objective)
            if ann.feasible and (shown is None or self.objective.better(_value(ann), shown)):
                shown = ann.value
        self.progress(sims, self.cfg.budget, shown)

    def record(self, batch: list[int], done: dict[int, EvaluationRecord]) -> list[float | None]:
        """Score the batch's results in order, count the budget, keep the best; their losses."""
        scored = [annotate(done[j], self.objective, len(self.records) + j) for j in range(len(batch))]
        for rec in scored:
            self.records.append(rec)
            self.simulations += rec.evaluation.costs_budget
            if rec.feasible and (self.best is None or self.objective.better(_value(rec), _value(self.best))):
                self.best = rec
        return [r.loss for r in scored]


def no_plan_message(space: SearchSpace, arg_names: ArgNames = CLI_ARG_NAMES) -> str:
    """Why a space is empty: the rules that rejected its combinations, most frequent first (naming
    the arguments as ``arg_names`` does)."""
    total = space.rejected_total
    reasons = "; ".join(rule.said(arg_names) + (f" ({n} of them)" if total > 1 else "")
                        for rule, n in space.rejected.most_common(5))
    every = f"all {total} combinations of the search space break a rule" if total != 1 else \
        "the one combination of the search space breaks a rule"
    return (f"no feasible plan on {space.cluster.world_size} devices: {every}"
            + (f" — {reasons}" if reasons else "")
            + f". Relax {arg_names.name('--fix')} or change {arg_names.name('--global-batch')}.")


__all__ = ["SweepConfig", "SweepResult", "annotate", "no_plan_message", "open_executor", "run_sweep"]
