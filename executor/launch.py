"""``mindpipe run``: validate a plan, then run it under torchrun (or, on one CPU host, the spawner) with a watchdog.

The plan is checked before any process starts (:func:`mindpipe.executor.precheck.check_run`); a plan
that cannot work is refused with the reason. The memory check is the caller's (``memory_check``:
the CLI passes the simulator's memory model, which the executor does not import). A resumed
checkpoint is verified here too (:func:`mindpipe.executor.checkpoint_trust.check_resume`: owner,
permissions, manifest, model, TP), before any rank — or torch's unpickling reader — sees it. On one
node the launcher picks a free port on 127.0.0.1 and sets ``GLOO_SOCKET_IFNAME=lo`` (gloo otherwise
binds the host name's interface and may hang); across nodes it passes torchrun's rendezvous options
through unchanged.

On one host with the CPU the ranks are forked from one interpreter that imported torch once
(:mod:`mindpipe.executor.spawn`, :func:`uses_spawner`), which saves each rank's imports and
torchrun's; it behaves as torchrun with ``--max-restarts 0`` does, and records its root cause in
the run directory instead of printing it.

Failure handling: torchrun (``--max-restarts 0``) or the spawner ends every rank as soon as one exits with an
error; each rank's collectives time out after ``--timeout`` seconds if a peer vanishes; and
``--run-timeout`` bounds the whole run. The error reported is one line: the first failing rank and
its own exception (ranks leave it in the run directory, :mod:`mindpipe.executor.rundir`), or
torchrun's exit record for a rank that died without one; exit code 2 when that exception is an
input error (:class:`ContractError`), 1 otherwise. torchrun's and the ranks' output goes to a log
file, kept on failure and named in the error line, removed after a successful run. Interrupting or
killing the launcher stops torchrun and every rank and removes the run's temporary files
(:mod:`mindpipe.executor.supervise`, :mod:`mindpipe.executor.watchdog`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mindpipe.executor import rundir, spawn, supervise
from mindpipe.executor.checkpoint_trust import check_resume, fresh_run_notes, repair_record
from mindpipe.executor.config import SMALL_MODEL_LR, RunConfig, check_launch_arguments, config_from_args, plan_source
from mindpipe.executor.precheck import MemoryCheck, catalog_device, check_run, detect_device
from mindpipe.traces.errors import ContractError
from mindpipe.traces.host_alloc import set_rank_allocator
from mindpipe.traces.schema import to_dict
from mindpipe.traces.trace import Trace
from mindpipe.traces.units import plural

EXIT_FAILED = 1
EXIT_INPUT = 2


class RunFailed(RuntimeError):
    """The launched run ended with an error (message names the failing rank; ``exit_code`` 2 or 1)."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED, log: str | None = None) -> None:
        self.exit_code = exit_code
        self.log = log
        super().__init__(message + (f" (full log: {log})" if log else ""))


class RunStopped(RuntimeError):
    """The launcher was told to stop (SIGTERM, SIGHUP); the run's processes were stopped."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}: every rank was stopped")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rendezvous(args: argparse.Namespace) -> bool:
    """Whether the launch names torchrun rendezvous options (then torchrun runs it, as given)."""
    return bool(args.rdzv_backend or args.rdzv_endpoint)


def torchrun_command(args: argparse.Namespace, config_path: str) -> list[str]:
    """The torchrun command line for this launch."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc), "--nnodes", str(args.nnodes),
           "--max-restarts", "0"]
    if _rendezvous(args):
        for flag, value in (("--rdzv-backend", args.rdzv_backend), ("--rdzv-endpoint", args.rdzv_endpoint),
                            ("--rdzv-id", args.rdzv_id)):
            if value:
                cmd += [flag, str(value)]
    else:
        cmd += ["--master-addr", args.master_addr or "127.0.0.1", "--master-port", str(args.master_port or free_port())]
        if args.node_rank is not None:
            cmd += ["--node-rank", str(args.node_rank)]
    return [*cmd, "-m", "mindpipe.executor", "--config", config_path]


def uses_spawner(args: argparse.Namespace, device_kind: str) -> bool:
    """Whether this launch forks its ranks from one interpreter (:mod:`mindpipe.executor.spawn`):
    a one-host CPU run. Multi-node and GPU runs go through torchrun."""
    return device_kind == "cpu" and str(args.nnodes) == "1" and not _rendezvous(args)


def launch_command(args: argparse.Namespace, config_path: str, device_kind: str) -> tuple[list[str], str]:
    """The command that starts every rank of this launch, and what it is called in errors: the
    spawner on one CPU host, else torchrun."""
    if uses_spawner(args, device_kind):
        # Port 0 unless the user chose one: the spawner binds any free port itself, so nothing can
        # take it between the choice and the bind.
        cmd = spawn.command(int(args.nproc), args.master_addr or "127.0.0.1", int(args.master_port or 0), config_path)
        return cmd, "the rank spawner"
    return torchrun_command(args, config_path), "torchrun"


def _environment(args: argparse.Namespace, device_kind: str, run_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    single_node = str(args.nnodes) == "1" and not args.rdzv_endpoint
    if single_node:
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if device_kind == "cpu":
        # Ranks share the host's cores; give each an equal share unless the user chose.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.nproc)))
        # Freed memory is kept for reuse, as a GPU's caching allocator keeps it, unless the user
        # chose glibc's malloc settings (the rule and why: mindpipe.traces.host_alloc).
        set_rank_allocator(env)
    env[rundir.RUN_DIR_ENV] = str(run_dir)
    # torchrun's own temporary directories (torchelastic_*) and the ranks' go inside the run
    # directory, so that they are removed with it however the run ends.
    (run_dir / "tmp").mkdir(exist_ok=True)
    env["TMPDIR"] = str(run_dir / "tmp")
    return env


def _root_cause(output: Sequence[str]) -> tuple[int, int] | None:
    """(rank, exit code) of torchrun's "Root Cause (first observed failure)" record, if printed."""
    text = "\n".join(output)
    at = text.rfind("Root Cause")
    m = re.search(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", text[at:], re.S) if at >= 0 else None
    return (int(m.group(1)), int(m.group(2))) if m else None


def _first_error(records: dict[int, rundir.RankError], output: Sequence[str], code: int = 1,
                 root: tuple[int, int] | None = None, runner: str = "torchrun") -> tuple[str, int]:
    """The failing rank and its error in one line, and the exit code (2: an input error in a rank).

    A rank that raised leaves its exception in the run directory; one that died without a Python
    error (killed, ``os._exit``) leaves none, and then the launcher's record names it: ``root``
    (rank, exit code) from the one-host spawner, else torchrun's "Root Cause" in ``output``.
    """
    root = root if root is not None else _root_cause(output)
    if root is not None and root[0] not in records:
        rank, code = root
        msg = f"rank {rank} {rundir.describe_exit(code)} without a Python error"
        if records:
            first = min(records.values(), key=lambda r: r.time)
            msg += f"; then rank {first.rank} failed: {first.error}"
        return msg, EXIT_FAILED
    if records:
        first = records[root[0]] if root is not None else min(records.values(), key=lambda r: r.time)
        others = sorted(r for r in records if r != first.rank)
        tail = f" (then ranks {others} failed too)" if others else ""
        return f"rank {first.rank} failed: {first.error}{tail}", EXIT_INPUT if first.kind == "input" else EXIT_FAILED
    if code < 0:
        return f"{runner} {rundir.describe_exit(code)}", EXIT_FAILED
    last = next((ln for ln in reversed(output) if ln.strip()), "no output")
    return f"{runner} failed: {last.strip()[:300]}", EXIT_FAILED


def check_checkpoint(cfg: RunConfig) -> tuple[int, list[str]]:
    """Refuse an untrusted checkpoint directory, and verify a resumed checkpoint, before anything
    starts; a run that does not resume gets its directory made here (one line if it cannot be) and
    a note when it already holds steps (:func:`~mindpipe.executor.checkpoint_trust.fresh_run_notes`);
    a resumed directory whose record is missing or damaged gets it rebuilt from the steps' manifests
    (:func:`~mindpipe.executor.checkpoint_trust.repair_record`), with a note.

    Returns the step the run resumes from (0: from the start) and the notes.

    Raises:
        ContractError: see :func:`mindpipe.executor.checkpoint_trust.check_resume`; or the
            checkpoint is already at ``--steps``.
    """
    if not cfg.checkpoint_dir:
        return 0, []
    if cfg.resume:
        notes = repair_record(cfg.checkpoint_dir)
        step = check_resume(cfg.checkpoint_dir, to_dict(cfg.model), cfg.plan.tp, cfg.resume_from)
        if step >= cfg.steps:
            raise ContractError("--steps", None, f"the checkpoint is at step {step}; --steps {cfg.steps} leaves nothing to run")
        return step, notes
    return 0, fresh_run_notes(cfg.checkpoint_dir)


def _keep_log(log: Path, records: dict[int, rundir.RankError]) -> None:
    """Add the ranks' tracebacks to a failed run's log (it stays; the line names it)."""
    with open(log, "a", encoding="utf-8") as fh:
        for r in sorted(records.values(), key=lambda r: r.time):
            fh.write(f"\n--- rank {r.rank} ({r.kind}) ---\n{r.traceback}")


class ProgressLine:
    """Prints the run's progress record (:func:`mindpipe.executor.rundir.read_progress`) to stderr as it
    advances, ever less often as the run goes on (:func:`~mindpipe.executor.rundir.progress_gap`) and
    always its last step; and every note a rank left (:func:`~mindpipe.executor.rundir.record_note`).
    """

    def __init__(self, run_dir: Path, unit: str = "step") -> None:
        self.run_dir, self.unit = run_dir, unit
        self.started = self.printed_at = time.monotonic()
        self.shown = 0
        self.notes_shown = 0

    def __call__(self) -> None:
        notes = rundir.read_notes(self.run_dir)
        for note in notes[self.notes_shown:]:
            with contextlib.suppress(OSError):
                print(f"mindpipe: note: {note}", file=sys.stderr, flush=True)
        self.notes_shown = max(self.notes_shown, len(notes))
        progress = rundir.read_progress(self.run_dir)
        if progress is None or progress.step <= self.shown:
            return
        now = time.monotonic()
        if now - self.printed_at < rundir.progress_gap(now - self.started) and progress.step < progress.steps:
            return
        with contextlib.suppress(OSError):  # a closed stderr must not stop the training it reports on
            print(f"mindpipe: [{now - self.started:6.0f} s] {progress.line(self.unit)}", file=sys.stderr, flush=True)
        self.shown, self.printed_at = progress.step, now


def run_under_torchrun(cfg: Any, args: argparse.Namespace, kind: str, run_timeout: float | None,
                       progress_unit: str = "step") -> None:
    """Save ``cfg`` (a run config with ``save``) in a private run directory and run every rank under torchrun.

    While the ranks run, their progress is printed (:class:`ProgressLine`; ``progress_unit`` names
    what they count: ``step``, or ``subnet`` for a supernet run).

    Raises:
        RunFailed: a rank failed, or the run exceeded ``run_timeout`` (the log is kept and named).
        RunStopped: SIGTERM or SIGHUP; KeyboardInterrupt: SIGINT (every process stopped either way).
    """
    run_dir = Path(tempfile.mkdtemp(prefix="mindpipe-run-"))
    fd, log_name = tempfile.mkstemp(prefix=f"{run_dir.name}.", suffix=".log")  # exclusive, mode 0600
    os.close(fd)
    log = Path(log_name)
    watchdog = supervise.start_watchdog(run_dir, log)
    keep = False
    try:
        config_path = run_dir / "config.json"
        cfg.save(config_path)
        cmd, runner = launch_command(args, str(config_path), kind)
        print("mindpipe: " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
        show = ProgressLine(run_dir, progress_unit)
        try:
            code, output = supervise.run_torchrun(cmd, _environment(args, kind, run_dir), run_dir, log, watchdog,
                                                  run_timeout, show)
        except supervise.Signalled as e:
            raise RunStopped(e.signum) from None
        show()  # the last step, recorded after the last tick
        if code not in (0, None) and not rundir.read_errors(run_dir) and rundir.all_finished(run_dir):
            # Every rank had passed the run's last barrier (rank 0 had written the outputs) when one
            # died in torch's teardown (destroy_process_group / interpreter exit; seen on gloo as
            # SIGABRT "terminate called without an active exception", a few runs in hundreds).
            # The results are complete: say so and keep the log for whoever wants to look.
            keep = True
            how, _ = _first_error({}, output, code, rundir.read_root_cause(run_dir), runner)
            print(f"mindpipe: warning: {how} after every rank had finished the run (in torch's teardown); "
                  f"the outputs are complete (log: {log})", file=sys.stderr, flush=True)
        elif code != 0:
            keep = True
            records = rundir.read_errors(run_dir)
            _keep_log(log, records)
            if code is None:
                raise RunFailed(f"run exceeded --run-timeout {run_timeout:g} s; all ranks were stopped", log=str(log))
            msg, exit_code = _first_error(records, output, code, rundir.read_root_cause(run_dir), runner)
            raise RunFailed(msg, exit_code, log=str(log))
    finally:
        stopped = not any(rundir.alive(p) for p in rundir.ranks(run_dir))
        shutil.rmtree(run_dir, ignore_errors=True)
        if not keep:
            log.unlink(missing_ok=True)
        supervise.release(watchdog, done=stopped)  # if a rank survived, the watchdog ends it


def launch(cfg: RunConfig, args: argparse.Namespace, run_timeout: float | None = None,
           memory_check: MemoryCheck | None = None) -> Trace | None:
    """Validate, launch torchrun, wait; returns the measured trace (None when ``cfg.out`` is unset).

    ``memory_check`` estimates each pipeline rank's memory and refuses a plan that does not fit
    (:func:`mindpipe.executor.precheck.check_run`); the CLI passes the simulator's. None skips
    the memory check (the launcher prints a note).

    Raises:
        ContractError: the plan or the checkpoint is refused before launch.
        RunFailed: a rank failed, or the run exceeded ``run_timeout`` (the log is kept and named).
        RunStopped: SIGTERM or SIGHUP; KeyboardInterrupt: SIGINT (every process stopped either way).
    """
    kind, gpu = detect_device(cfg.device)
    spec = catalog_device(kind, gpu)
    world = None if ":" in str(args.nnodes) else int(args.nproc) * int(args.nnodes)
    pre = check_run(cfg.model, cfg.plan, world if world is not None else cfg.plan.world_size, kind, spec,
                    cfg.schedule_source, text_data=cfg.data != "synthetic", source=plan_source(args.plan),
                    ranks_per_device=int(args.nproc) if kind == "cpu" else 1, memory_check=memory_check,
                    memory_budget_gib=cfg.memory_budget_gib)
    start, checkpoint_notes = check_checkpoint(cfg)
    notes = list(pre.notes) + checkpoint_notes
    if 0 < cfg.steps - start <= cfg.warmup_steps:  # the worker then times every step (executor/worker.py _loop)
        notes.append(f"--warmup-steps {cfg.warmup_steps} would leave nothing to time of this run's "
                     f"{plural(cfg.steps - start, 'step')}: every step is timed, the first one's start-up costs included")
    for note in notes:
        print(f"mindpipe: note: {note}", file=sys.stderr, flush=True)
    return run_and_read(cfg, args, kind, run_timeout)


def run_and_read(cfg: Any, args: argparse.Namespace, kind: str, run_timeout: float | None,
                 progress_unit: str = "step") -> Trace | None:
    """Run every rank of this node (:func:`run_under_torchrun`) and read the measured trace at
    ``cfg.out``: None when unset, or on a node of a multi-node run that did not run global rank
    0, which writes it on its own node (a note says so on stderr, and under ``--json`` an object
    with ``out`` null on stdout)."""
    started = time.time()
    run_under_torchrun(cfg, args, kind, run_timeout, progress_unit)
    if not cfg.out:
        return None
    if str(args.nnodes) != "1" and not _written_since(cfg.out, started):
        note = "the node that ran global rank 0 writes the measured trace, to the --out given there"
        print(f"mindpipe: this node's ranks finished; {note} (nothing was written to {cfg.out} here)",
              file=sys.stderr, flush=True)
        if getattr(args, "json", False):  # --json: still one object on stdout
            print(json.dumps({"out": None, "note": note}))
        return None
    return Trace.load(cfg.out)


def _written_since(path: str, since: float) -> bool:
    """Whether ``path`` exists and was written at or after ``since`` (time.time())."""
    try:
        return os.stat(path).st_mtime >= since - 1.0
    except FileNotFoundError:
        return False


def summary(trace: Trace) -> dict[str, object]:
    """The run's headline numbers (what ``--json`` prints). Memory twice, as measured two ways:
    ``peak_memory_bytes`` (``peak_memory_source``: the CUDA allocator's peak, or a CPU process's
    resident set, interpreter and libraries included) and ``device_peak_bytes``
    (``device_memory_source``: what the text output, the memory model and ``--memory-budget-gib``
    use — the allocator's peak, or the live-tensor accounting on a CPU; null for a rank without
    the record)."""
    m = trace.measurement
    if m is None:
        raise ContractError("trace", "measurement", "not a measured run (no measurement record)")
    devices = [r.memory for r in m.ranks if r.memory is not None]
    return {
        "steps": [s.step for s in m.steps], "losses": m.losses, "iteration_s": m.iteration_s,
        "tokens_per_s": m.tokens_per_s, "mfu": m.mfu, "energy_j_per_iteration": m.energy_j_per_iteration,
        "energy_source": m.energy_source, "peak_memory_bytes": max(r.peak_memory_bytes for r in m.ranks),
        "peak_memory_source": m.ranks[0].memory_source,
        "device_peak_bytes": max(d.peak_bytes for d in devices) if len(devices) == len(m.ranks) else None,
        "device_memory_source": devices[0].source if devices else None,
        "world_size": m.world_size, "backend": m.backend, "schedule_source": m.schedule_source,
    }


def reported(start: Callable[[], Trace | None]) -> tuple[Trace | None, int]:
    """Run ``start`` (a launch that returns the measured trace or None) and turn how it ended into
    the command's exit code: (trace, 0), or (None, code) after printing the one line of a failed
    run (its exit code) or a stopped one (128 + the signal)."""
    try:
        return start(), 0
    except RunFailed as e:
        print(f"mindpipe: error: {e}", file=sys.stderr, flush=True)
        return None, e.exit_code
    except RunStopped as e:
        print(f"mindpipe: {e}", file=sys.stderr, flush=True)
        return None, 128 + e.signum


def cmd_run(args: argparse.Namespace, argv: Sequence[str], memory_check: MemoryCheck | None = None) -> int:
    """``mindpipe run PLAN --nproc N --steps S ...`` (handler registered by :mod:`mindpipe.cli`).

    ``memory_check``: see :func:`launch` (the CLI builds it on ``Simulator.refuse_unless_fits``).
    """
    check_launch_arguments(args)
    from mindpipe.executor.supernet_launch import cmd_run_supernet, is_supernet_model

    if is_supernet_model(args.model):
        return cmd_run_supernet(args)
    if getattr(args, "repartition", None) is not None:
        raise ContractError("command line", "repartition", "--repartition is for supernet runs (--model SUPERNET)")
    cfg = config_from_args(args)
    if args.lr is None and cfg.lr < SMALL_MODEL_LR:
        print(f"mindpipe: learning rate {cfg.lr:.3g} (GPT-3's for {cfg.model.param_count() / 1e9:.3g}B parameters; "
              f"--lr sets it)", file=sys.stderr, flush=True)
    started = time.perf_counter()
    trace, code = reported(lambda: launch(cfg, args, run_timeout=args.run_timeout, memory_check=memory_check))
    if trace is None:
        return code
    info = summary(trace)
    print(f"mindpipe: wrote {cfg.out} ({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({**info, "out": cfg.out, "timeline": cfg.timeline_path}))
        return 0
    m = trace.measurement
    if m is not None:
        warmup = {s.step for s in m.steps[:m.warmup_steps]}
        clean = {s.step for s in m.clean_steps}
        profiled = m.profiled_steps - clean
        for s in m.steps:
            tag = "  (warm-up)" if s.step in warmup else "  (profiled)" if s.step in profiled else ""
            print(f"step {s.step:5d}  loss {s.loss:.6f}  {s.iteration_s:.4g} s{tag}")
        mfu = f"MFU {100 * m.mfu:.2f}%" if m.peak_flops_per_s > 0 else \
            "MFU n/a (the catalog's peak for this device was measured on another CPU)"
        print(f"iteration {info['iteration_s']:.4g} s (median of {len(clean)} step{'s' * (len(clean) != 1)}), "
              f"{m.tokens_per_s:.4g} tokens/s, {mfu}, "
              f"energy {m.energy_j_per_iteration:.4g} J/iteration ({m.energy_source})")
    return 0


__all__ = ["RunFailed", "RunStopped", "check_checkpoint", "cmd_run", "free_port", "launch", "launch_command", "reported", "run_and_read",
           "run_under_torchrun", "summary", "torchrun_command", "uses_spawner"]
