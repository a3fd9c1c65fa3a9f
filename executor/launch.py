"""``mindpipe run``: validate a plan, then run it under torchrun with a watchdog.

The plan is checked before any process starts (:func:`mindpipe.executor.precheck.check_run`); a plan
that cannot work is refused with the reason. The memory check is the caller's (``memory_check``:
the CLI passes the simulator's memory model, which the executor does not import). On one node the launcher picks a free port on
127.0.0.1 and sets ``GLOO_SOCKET_IFNAME=lo`` (gloo otherwise binds the host name's interface and
may hang); across nodes it passes torchrun's rendezvous options through unchanged.

Failure handling: torchrun (``--max-restarts 0``) ends every rank as soon as one exits with an
error; each rank's collectives time out after ``--timeout`` seconds if a peer vanishes; and
``--run-timeout`` bounds the whole run. The error reported is the first failing rank's own
exception (ranks write it to a run directory), or torchrun's exit record for a rank that died
without one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from mindpipe.executor.config import RunConfig, config_from_args, plan_source
from mindpipe.executor.precheck import MemoryCheck, catalog_device, check_run, detect_device
from mindpipe.traces.errors import ContractError
from mindpipe.traces.trace import Trace

EXIT_FAILED = 1
ERROR_DIR_ENV = "MINDPIPE_ERROR_DIR"  # where ranks leave their exception (read by executor.worker)


class RunFailed(RuntimeError):
    """The launched run ended with an error (message names the failing rank)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_command(args: argparse.Namespace, config_path: str) -> list[str]:
    """The torchrun command line for this launch."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc), "--nnodes", str(args.nnodes),
           "--max-restarts", "0"]
    if args.rdzv_backend or args.rdzv_endpoint:
        for flag, value in (("--rdzv-backend", args.rdzv_backend), ("--rdzv-endpoint", args.rdzv_endpoint),
                            ("--rdzv-id", args.rdzv_id)):
            if value:
                cmd += [flag, str(value)]
    else:
        cmd += ["--master-addr", args.master_addr or "127.0.0.1", "--master-port", str(args.master_port or free_port())]
        if args.node_rank is not None:
            cmd += ["--node-rank", str(args.node_rank)]
    return [*cmd, "-m", "mindpipe.executor", "--config", config_path]


def _environment(args: argparse.Namespace, device_kind: str) -> dict[str, str]:
    env = dict(os.environ)
    single_node = str(args.nnodes) == "1" and not args.rdzv_endpoint
    if single_node:
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if device_kind == "cpu":
        # Ranks share the host's cores; give each an equal share unless the user chose.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.nproc)))
    return env


def _root_cause(output: Sequence[str]) -> tuple[int, int] | None:
    """(rank, exit code) of torchrun's "Root Cause (first observed failure)" record, if printed."""
    text = "\n".join(output)
    at = text.rfind("Root Cause")
    m = re.search(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", text[at:], re.S) if at >= 0 else None
    return (int(m.group(1)), int(m.group(2))) if m else None


def _first_error(error_dir: Path, output: Sequence[str]) -> str:
    """The failing rank and its error: the root cause torchrun saw, with the rank's own exception.

    A rank that raised leaves its exception in ``error_dir``; one that died without a Python
    error (killed, ``os._exit``) leaves none, and then torchrun's record names it.
    """
    records = {}
    for f in error_dir.glob("rank*.json"):
        try:
            r = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        records[int(r["rank"])] = r
    root = _root_cause(output)
    if root is not None and root[0] not in records:
        rank, code = root
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        msg = f"rank {rank} {how} without a Python error"
        if records:
            first = min(records.values(), key=lambda r: r["time"])
            msg += f"; then rank {first['rank']} failed: {first['error']}"
        return msg
    if records:
        first = records[root[0]] if root is not None else min(records.values(), key=lambda r: r["time"])
        others = sorted(r for r in records if r != first["rank"])
        tail = f" (then ranks {others} failed too)" if others else ""
        return f"rank {first['rank']} failed: {first['error']}{tail}"
    return "torchrun failed: " + (output[-1] if output else "no output")


def launch(cfg: RunConfig, args: argparse.Namespace, run_timeout: float | None = None,
           memory_check: MemoryCheck | None = None) -> Trace | None:
    """Validate, launch torchrun, wait; returns the measured trace (None when ``cfg.out`` is unset).

    ``memory_check`` estimates each pipeline rank's memory and refuses a plan that does not fit
    (:func:`mindpipe.executor.precheck.check_run`); the CLI passes the simulator's. None skips
    the memory check (the launcher prints a note).

    Raises:
        ContractError: the plan is refused before launch.
        RunFailed: a rank failed, or the run exceeded ``run_timeout``.
    """
    kind, gpu = detect_device(cfg.device)
    spec = catalog_device(kind, gpu)
    world = None if ":" in str(args.nnodes) else int(args.nproc) * int(args.nnodes)
    pre = check_run(cfg.model, cfg.plan, world if world is not None else cfg.plan.world_size, kind, spec,
                    cfg.schedule_source, text_data=cfg.data != "synthetic", source=plan_source(args.plan),
                    ranks_per_device=int(args.nproc) if kind == "cpu" else 1, memory_check=memory_check)
    for note in pre.notes:
        print(f"mindpipe: note: {note}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="mindpipe-run-") as tmp:
        config_path = Path(tmp) / "config.json"
        cfg.save(config_path)
        error_dir = Path(tmp) / "errors"
        env = _environment(args, kind)
        env[ERROR_DIR_ENV] = str(error_dir)
        cmd = torchrun_command(args, str(config_path))
        print("mindpipe: " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
        tail: deque[str] = deque(maxlen=400)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)

        def pump() -> None:
            for line in proc.stdout or ():
                tail.append(line.rstrip("\n"))
                sys.stderr.write(line)
            sys.stderr.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout=run_timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise RunFailed(f"run exceeded --run-timeout {run_timeout:g} s; all ranks were stopped") from None
        except KeyboardInterrupt:
            _kill(proc)
            raise
        reader.join(timeout=10)
        if code != 0:
            raise RunFailed(_first_error(error_dir, list(tail)))
    return Trace.load(cfg.out) if cfg.out else None


def _kill(proc: subprocess.Popen[str]) -> None:
    """Stop torchrun and every rank it started (they share its session)."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def summary(trace: Trace) -> dict[str, object]:
    """The run's headline numbers (what ``--json`` prints)."""
    m = trace.measurement
    if m is None:
        raise ContractError("trace", "measurement", "not a measured run (no measurement record)")
    steps = m.measured_steps
    return {
        "steps": [s.step for s in m.steps], "losses": m.losses, "iteration_s": sum(s.iteration_s for s in steps) / len(steps),
        "tokens_per_s": m.tokens_per_s, "mfu": m.mfu, "energy_j_per_iteration": m.energy_j_per_iteration,
        "energy_source": m.energy_source, "peak_memory_bytes": max(r.peak_memory_bytes for r in m.ranks),
        "world_size": m.world_size, "backend": m.backend, "schedule_source": m.schedule_source,
    }


def cmd_run(args: argparse.Namespace, argv: Sequence[str], memory_check: MemoryCheck | None = None) -> int:
    """``mindpipe run PLAN --nproc N --steps S ...`` (handler registered by :mod:`mindpipe.cli`).

    ``memory_check``: see :func:`launch` (the CLI builds it on ``Simulator.refuse_unless_fits``).
    """
    cfg = config_from_args(args)
    started = time.perf_counter()
    try:
        trace = launch(cfg, args, run_timeout=args.run_timeout, memory_check=memory_check)
    except RunFailed as e:
        print(f"mindpipe: error: {e}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    if trace is None:
        return 0
    info = summary(trace)
    print(f"mindpipe: wrote {cfg.out} ({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({**info, "out": cfg.out, "timeline": cfg.timeline_path}))
        return 0
    m = trace.measurement
    if m is not None:
        for s in m.steps:
            print(f"step {s.step:5d}  loss {s.loss:.6f}  {s.iteration_s:.4g} s")
        print(f"iteration {info['iteration_s']:.4g} s, {m.tokens_per_s:.4g} tokens/s, MFU {100 * m.mfu:.2f}%, "
              f"energy {m.energy_j_per_iteration:.4g} J/iteration ({m.energy_source})")
    return 0


__all__ = ["RunFailed", "cmd_run", "free_port", "launch", "summary", "torchrun_command"]
