"""``python -m mindpipe.executor PLAN --steps S ...``: one rank, under torchrun or a cluster scheduler.

Every rank of the job runs this module; torchrun (or ``srun`` with ``MASTER_ADDR``/``MASTER_PORT``
exported) provides the rank and world size, and without either it trains as a single process.
``mindpipe run`` launches it as ``python -m mindpipe.executor --config FILE`` with the validated config.
Input problems print one line ``executor: error: ...`` and exit with code 2 (under ``mindpipe run``
the rank also leaves the error for the launcher, :mod:`mindpipe.executor.rundir`). Started directly, the
rank runs the launcher's checks except the memory pre-check (the simulator's memory model, which
the executor does not import), and rank 0 prints the notes.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import os
import shlex
import sys
from collections.abc import Sequence

from mindpipe.executor.config import RunConfig, add_run_arguments, config_from_args
from mindpipe.executor.precheck import (
    catalog_device,
    check_run,
    detect_device,
    env_rank,
    env_world_size,
    ranks_per_host,
)
from mindpipe.executor.rundir import record_error, register_rank
from mindpipe.traces.errors import ContractError


def _supernet_config(path: str) -> bool:
    from mindpipe.executor.supernet_config import is_supernet_config
    from mindpipe.traces.reading import CONFIG
    from mindpipe.traces.schema import read_json

    return is_supernet_config(read_json(path, CONFIG))


def prepare_ranks(config_path: str) -> None:
    """Read the run's config (a :class:`ContractError` if it is not one) and import what :func:`main`
    will import to run it (torch and the executor's worker): the one-host spawner
    (:mod:`mindpipe.executor.spawn`) does this once, before forking every rank."""
    if _supernet_config(config_path):
        from mindpipe.executor.supernet_config import SupernetRunConfig

        SupernetRunConfig.load(config_path)
        importlib.import_module("mindpipe.executor.supernet_worker")
    else:
        RunConfig.load(config_path)
        importlib.import_module("mindpipe.executor.worker")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments and run this rank."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # A native crash (SIGSEGV, SIGABRT in torch/gloo) prints every thread's Python stack to the
    # rank's stderr, i.e. into the run's log, instead of nothing.
    faulthandler.enable(all_threads=True)
    register_rank()  # under mindpipe run: die with torchrun, and be found by the launcher
    try:
        if argv[:1] == ["--config"] and len(argv) == 2 and _supernet_config(argv[1]):
            from mindpipe.executor.supernet_config import SupernetRunConfig
            from mindpipe.executor.supernet_worker import run as run_supernet  # imports torch

            return run_supernet(SupernetRunConfig.load(argv[1]))
        if argv[:1] == ["--config"] and len(argv) == 2:
            cfg = RunConfig.load(argv[1])
            command, source = "", "plan"
        else:
            p = argparse.ArgumentParser(prog="python -m mindpipe.executor", description="Run one rank of a MindPipe plan.")
            add_run_arguments(p, launcher=False)
            args = p.parse_args(argv)
            from mindpipe.executor.config import plan_source
            from mindpipe.executor.supernet_launch import is_supernet_model, precheck, supernet_config

            if is_supernet_model(args.model):  # a supernet rank started directly: the launcher's checks, then run
                scfg = supernet_config(args)
                precheck(scfg, env_world_size(), plan_source(args.plan))
                from mindpipe.executor.supernet_worker import run as run_supernet  # imports torch

                return run_supernet(scfg, command="python -m mindpipe.executor " + shlex.join(argv))
            cfg = config_from_args(args)
            command = "python -m mindpipe.executor " + " ".join(shlex.quote(a) for a in argv)
            source = plan_source(args.plan)
        # Refuse an impossible plan before importing torch (seconds per rank). No memory model
        # here: the executor does not import the simulator's (mindpipe run checks memory itself).
        kind, gpu = detect_device(cfg.device)
        pre = check_run(cfg.model, cfg.plan, env_world_size(), kind, catalog_device(kind, gpu), cfg.schedule_source,
                        text_data=cfg.data != "synthetic", source=source,
                        ranks_per_device=ranks_per_host() if kind == "cpu" else 1)
        if command and env_rank() == 0:  # started directly: nobody printed the notes (mindpipe run does)
            for note in pre.notes:
                print(f"executor: note: {note}", file=sys.stderr, flush=True)
        from mindpipe.executor.worker import run  # imports torch

        return run(cfg, command=command, pre=pre)
    except ContractError as e:
        record_error(env_rank(), e)  # before torch: the launcher reports it (a no-op if the rank already did)
        print(f"executor: error: {e}", file=sys.stderr, flush=True)
        return 2


def exit_without_teardown(code: int) -> None:
    """Leave the process without running C++ static destructors.

    On gloo, torch's teardown at interpreter exit aborts now and then (SIGABRT, "terminate called
    without an active exception", no Python frame left: 1 of 40 dp2 runs of gpt-mini here) after
    every result is written. A rank has nothing left to do once :func:`main` returned — the outputs
    are written and synced, the process group destroyed — so it flushes its streams and exits
    directly. The launcher still tolerates such a crash after the run's last barrier
    (:func:`mindpipe.executor.rundir.all_finished`)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_teardown(main())
