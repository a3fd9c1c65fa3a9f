"""``python -m mindpipe.executor.spawn --nproc N --master-port P --config FILE``: the ranks of a one-host CPU run.

``mindpipe run`` on one host with the CPU starts its ranks with this module instead of torchrun.
Under torchrun every rank is a fresh interpreter that imports torch and the executor (about 5 s of
CPU each on a 2-core machine, most of it ``torch``, ``torch.distributed.tensor`` and
``torch.distributed.pipelining``), and torchrun itself imports torch too (about 3 s). Here one
process imports the rank's modules once, then forks every rank from that image: a 4-rank run
starts about 19 CPU-seconds sooner. Each rank is the same ``python -m mindpipe.executor --config
FILE`` entry point (:func:`mindpipe.executor.__main__.main`), with torchrun's environment
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``).
As torchrun's agent does, this process hosts the rendezvous store (a TCPStore server; the ranks
are its clients through ``TORCHELASTIC_USE_AGENT_STORE``), bound after the forks (they copy no
thread of it) on the port asked for or, by default, on any free port, which then reaches each rank
through a pipe: no other process can take the port between choosing it and binding it.

What torchrun does for ``mindpipe run`` (``--max-restarts 0``) this does too: every rank runs in a
session of its own; the first rank to exit with an error (or die by a signal) is the run's cause,
written for the launcher (:func:`mindpipe.executor.rundir.record_root_cause`); the other ranks
then get SIGTERM, and SIGKILL after a grace period; this process exits 1. SIGTERM, SIGHUP or
SIGINT to it stop every rank the same way. A rank dies with it (``PR_SET_PDEATHSIG``,
:func:`mindpipe.executor.rundir.register_rank`).

Only the CPU uses it: forking after CUDA's driver is initialised breaks the child, and a GPU job's
start-up is seconds against minutes of work. Multi-node runs and GPU runs keep torchrun.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from mindpipe.executor import rundir
from mindpipe.traces.errors import ContractError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
NO_STORE = 3  # a rank's exit code when the spawner could not host the store (it says why itself)
STORE_TIMEOUT_S = 1800.0
# How long the other ranks get to end on their own after one died past the run's last barrier.
TEARDOWN_GRACE_S = 30.0


class _Stop(BaseException):
    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signum)


def _rank(rank: int, nproc: int, addr: str, port_pipe: int, argv: list[str], parent: int) -> NoReturn:
    """The forked child: become rank ``rank`` and run the executor's entry point; never returns.

    The store's port arrives on ``port_pipe`` once the spawner has bound it (end of file: it could
    not, and has said why; the rank leaves quietly).
    """
    from mindpipe.executor import __main__ as entry

    code = 1
    try:
        rundir.die_with_parent(parent)  # started directly too, not only under mindpipe run
        os.setsid()  # a session (and process group) of its own, as torchrun's ranks have
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        with os.fdopen(port_pipe, "rb") as fh:
            port = fh.read().strip()
        if not port.isdigit():
            entry.exit_without_teardown(NO_STORE)
        os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
                           "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": addr,
                           "MASTER_PORT": port.decode(), "TORCHELASTIC_USE_AGENT_STORE": "True",
                           "TORCHELASTIC_RESTART_COUNT": "0"})
        sys.argv = [sys.argv[0], *argv]
        code = entry.main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # a rank's uncaught error: printed as Python would, exit 1
        traceback.print_exc()
        code = 1
    entry.exit_without_teardown(code)
    raise AssertionError("unreachable")  # exit_without_teardown does not return


def _reap(children: dict[int, int], block: bool) -> tuple[int, int, int] | None:
    """(pid, rank, exit code: negative for a signal) of one child that ended, or None (``block`` False)."""
    while children:
        pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        if pid == 0:
            return None
        if pid in children:
            return pid, children.pop(pid), os.waitstatus_to_exitcode(status)
    return None


def _reap_within(children: dict[int, int], wait_s: float) -> None:
    """Reap the ranks that end within ``wait_s`` (the rest stay in ``children``)."""
    deadline = time.monotonic() + wait_s
    while children and time.monotonic() < deadline:
        if _reap(children, block=False) is None:
            time.sleep(0.05)


def _stop_all(children: dict[int, int], grace_s: float) -> None:
    """SIGTERM every remaining rank's group, SIGKILL after ``grace_s``, and reap them all."""
    for sig in STOP_SIGNALS:  # a second Ctrl-C does not interrupt the stopping
        signal.signal(sig, signal.SIG_IGN)
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30.0)):
        for pid in list(children):
            rundir.signal_process(rundir.ProcRef(pid, None), sig)  # a group leader (setsid); unreaped, so not reused
        _reap_within(children, wait)
        if not children:
            return


def _host_store(addr: str, port: int) -> Any:
    """A TCPStore server on ``addr:port`` (``port`` 0: any free one, so no other process can take it
    between choosing and binding); None after saying why on stderr."""
    import datetime as dt

    import torch.distributed as dist

    try:
        return dist.TCPStore(addr, port, is_master=True, wait_for_workers=False,
                             timeout=dt.timedelta(seconds=STORE_TIMEOUT_S))
    except (RuntimeError, OSError, ValueError) as e:
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        print(f"spawn: error: cannot host the rendezvous store on {addr}:{port}: {first}", file=sys.stderr, flush=True)
        return None


def _raise_stop(signum: int, frame: object) -> None:
    """The spawner's handler of :data:`STOP_SIGNALS`: unwind to :func:`spawn`, which stops every rank."""
    raise _Stop(signum)


def _fork_ranks(nproc: int, addr: str, argv: list[str]) -> tuple[dict[int, int], list[int]]:
    """Fork the ``nproc`` ranks, then install the stop handlers; (pid -> rank, the port pipes' write ends).

    The stop signals stay blocked from the first fork until the handlers are in place.
    """
    children: dict[int, int] = {}
    writers: list[int] = []
    me = os.getpid()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # no signal between a fork and its handlers
    try:
        for rank in range(nproc):
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:
                for fd in (*writers, write_end):
                    os.close(fd)
                _rank(rank, nproc, addr, read_end, argv, me)
            os.close(read_end)
            children[pid] = rank
            writers.append(write_end)
        for sig in STOP_SIGNALS:
            signal.signal(sig, _raise_stop)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return children, writers


def _send_port(writers: list[int], port: int) -> None:
    """Tell every rank the store's port and close the pipes (``writers`` is left empty: nothing to close after)."""
    for fd in writers:
        os.write(fd, f"{port}\n".encode())
    for fd in writers:
        os.close(fd)
    writers.clear()


def _watch(children: dict[int, int], grace_s: float) -> int:
    """Wait for every rank; the first to fail is the run's cause and the others are stopped. The exit code."""
    while children:
        done = _reap(children, block=True)
        if done is None or done[2] == 0:
            continue
        _, rank, code = done
        rundir.record_root_cause(rank, code)
        if rundir.has_finished(rank):
            # It died in teardown, after the run's last barrier: every other rank is past it too and
            # only tearing down. Stopping them now could kill one before it records that it finished
            # (and so turn complete results into a failed run); they are given time to end first.
            print(f"spawn: rank {rank} {rundir.describe_exit(code)} after it finished the run", file=sys.stderr,
                  flush=True)
            _reap_within(children, TEARDOWN_GRACE_S)
        else:
            print(f"spawn: rank {rank} {rundir.describe_exit(code)}; stopping the other ranks", file=sys.stderr,
                  flush=True)
        _stop_all(children, grace_s)
        return 1
    return 0


def spawn(nproc: int, addr: str, port: int, config_path: str, grace_s: float = 10.0) -> int:
    """Fork ``nproc`` ranks running ``python -m mindpipe.executor --config CONFIG_PATH`` and wait for
    them; the exit code (0, 1, or 128 + a signal that stopped it).

    Raises:
        ContractError: the config cannot be read or is not a run config (before any rank starts).
    """
    from mindpipe.executor import __main__ as entry

    entry.prepare_ranks(config_path)  # the expensive part, once, before the fork
    argv = ["--config", config_path]
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    children, writers = _fork_ranks(nproc, addr, argv)
    try:
        # The rendezvous store, hosted here as torchrun's agent hosts it (the ranks are its clients),
        # bound only now: the forks above copy no thread of it, and no rank needs it before this.
        store = _host_store(addr, port)
        if store is None:
            _stop_all(children, grace_s)
            return 1
        _send_port(writers, store.port)
        return _watch(children, grace_s)
    except _Stop as e:
        print(f"spawn: stopped by {signal.Signals(e.signum).name}; stopping every rank", file=sys.stderr, flush=True)
        _stop_all(children, grace_s)
        return 128 + e.signum
    finally:
        for fd in writers:  # ranks still waiting for the port read end of file and leave
            os.close(fd)


def command(nproc: int, addr: str, port: int, config_path: str) -> list[str]:
    """The command line that starts this module for a run (``port`` 0: any free port)."""
    return [sys.executable, "-m", "mindpipe.executor.spawn", "--nproc", str(nproc), "--master-addr", addr,
            "--master-port", str(port), "--config", config_path]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m mindpipe.executor.spawn",
                                description="Fork the ranks of a one-host CPU run of mindpipe.executor.")
    p.add_argument("--nproc", type=int, required=True)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=0, help="the store's port (default 0: any free port)")
    p.add_argument("--config", required=True)
    args = p.parse_args(argv)
    if args.nproc < 1:
        p.error("--nproc must be at least 1")
    try:
        return spawn(args.nproc, args.master_addr, args.master_port, args.config)
    except ContractError as e:  # an unreadable or invalid config, before any rank starts
        print(f"spawn: error: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
