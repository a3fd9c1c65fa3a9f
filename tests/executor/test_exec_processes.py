"""``mindpipe run`` owns its processes: stopping the launcher in any way (SIGINT, SIGTERM, SIGKILL)
stops the rank spawner (or torchrun) and every rank and removes the run's temporary files; an error inside a rank
reaches the user as one line naming the rank, with exit 2 for bad input, 1 for a failure, and
the full log kept in the file the line names."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from .conftest import REPO, TINY, free_port, run_env, run_plan

PLAN = {"pp": 2, "micro_batch_size": 1, "global_batch_size": 4, "precision": "fp32"}
MARK = "MINDPIPE_TEST_MARK"


def _marked(mark: str) -> list[int]:
    """Live processes whose environment carries ``mark`` (the launcher passes its environment down)."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdecimal():
            continue
        try:
            env = (d / "environ").read_bytes()  # empty for a zombie: it runs nothing any more
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(d.name))
    return found


def _default_sigint() -> None:
    # A test runner started in the background inherits SIGINT ignored; a user's terminal does not.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the run's processes through /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_stopping_the_launcher_leaves_no_process_and_no_temporary_directory(tmp_path, sig):
    tmp = tmp_path / "tmp"  # the launcher's (and everything it starts) temporary directory
    tmp.mkdir()
    mark = uuid.uuid4().hex
    env = run_env(TMPDIR=str(tmp), **{MARK: mark})
    cmd = [sys.executable, "-m", "mindpipe.cli", "run", json.dumps(PLAN), "--nproc", "2", "--steps", "1000000",
           "--model", json.dumps(TINY), "--out", str(tmp_path / "measured.json"), "--timeout", "120"]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if len(list(tmp.glob("mindpipe-run-*/pids/*"))) == 2:  # both ranks are up
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(2)  # into training
        running = _marked(mark)
        assert proc.pid in running and len(running) >= 5, running  # launcher, watchdog, spawner, 2 ranks
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 60
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _marked(mark) == []
    assert sorted(p.name for p in tmp.iterdir()) == []  # run directory, log, torchrun's own temp dirs: all gone
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == {signal.SIGTERM: 143, signal.SIGINT: 130}[sig], err[-3000:]
        assert "Traceback" not in err and err.strip().splitlines()[-1] in (
            "mindpipe: stopped by SIGTERM: every rank was stopped", "mindpipe: interrupted"), err


@pytest.mark.parametrize(("fault", "code", "needle"), [
    ("1:2:contract", 2, "rank 1 failed: MINDPIPE_FAULT: injected input error on rank 1 at step 2"),
    ("0:2:raise", 1, "rank 0 failed: RuntimeError: injected fault on rank 0 at step 2"),
])
def test_an_error_in_a_rank_is_one_line_with_its_log(tmp_path, fault, code, needle):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    res = run_plan(tmp_path, PLAN, 2, "--schedule-source", "torch", steps=20,
                   env=run_env(MINDPIPE_FAULT=fault, TMPDIR=str(tmp)))
    assert res.returncode == code, res.stderr[-3000:]
    # Not the launch command's echo, nor the progress lines of the step before the fault.
    progress = [ln for ln in res.stderr.splitlines() if ln.startswith("mindpipe: [")]
    errors = [ln for ln in res.stderr.splitlines() if not ln.startswith(("mindpipe: /", "mindpipe: ["))]
    assert all(re.fullmatch(r"mindpipe: \[ +\d+ s\] step 1/20  loss \d+\.\d{6}  \S+ s/step", ln) for ln in progress), progress
    assert len(errors) == 1 and errors[0].startswith(f"mindpipe: error: {needle}"), res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "ChildFailedError" not in res.stderr
    log = Path(re.search(r"\(full log: (\S+)\)$", errors[0]).group(1))
    assert log.parent == tmp and log.is_file()
    text = log.read_text()
    assert "Traceback" in text and f"--- rank {fault[0]} ({'input' if code == 2 else 'failure'}) ---" in text
    assert [p.name for p in tmp.iterdir()] == [log.name]  # the run directory is gone, the log stays
    assert not (tmp_path / "measured.json").exists()


def test_a_successful_run_leaves_no_log(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    res = run_plan(tmp_path, {"micro_batch_size": 1, "global_batch_size": 2, "precision": "fp32"}, 1, steps=2,
                   env=run_env(TMPDIR=str(tmp)))
    assert res.returncode == 0, res.stderr[-3000:]
    assert list(tmp.iterdir()) == [] and (tmp_path / "measured.json").is_file()
    # The launcher showed the run's progress, its last step always (a single rank holds the loss).
    assert re.search(r"^mindpipe: \[ +\d+ s\] step 2/2  loss \d+\.\d{6}  \S+ s/step$", res.stderr, re.M), res.stderr


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the run's processes through /proc")
def test_the_spawner_started_by_hand_takes_its_ranks_with_it_when_killed(tmp_path):
    # Outside mindpipe run (no run directory, no watchdog) the forked ranks still die with the spawner.
    import argparse

    from mindpipe.executor.config import add_run_arguments, config_from_args
    from mindpipe.executor.spawn import command

    p = argparse.ArgumentParser()
    add_run_arguments(p, launcher=True)
    cfg = config_from_args(p.parse_args([json.dumps(PLAN), "--nproc", "2", "--steps", "1000000", "--model",
                                         json.dumps(TINY), "--timeout", "120"]))
    cfg.save(tmp_path / "config.json")
    mark = uuid.uuid4().hex
    proc = subprocess.Popen(command(2, "127.0.0.1", 0, str(tmp_path / "config.json")), cwd=REPO,
                            env=run_env(**{MARK: mark}), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None and len(_marked(mark)) < 3:
            time.sleep(0.1)
        assert proc.poll() is None and len(_marked(mark)) == 3, proc.communicate()[1][-3000:]  # spawner, 2 ranks
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 30
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _marked(mark) == []


def test_a_rendezvous_port_in_use_is_one_line(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = run_plan(tmp_path, PLAN, 2, "--master-port", str(port), steps=2)
    assert res.returncode == 1, res.stderr[-3000:]
    errors = [ln for ln in res.stderr.splitlines() if not ln.startswith(("mindpipe: /", "mindpipe: ["))]
    assert len(errors) == 1 and errors[0].startswith("mindpipe: error: the rank spawner failed: spawn: error: cannot "
                                                     f"host the rendezvous store on 127.0.0.1:{port}: "), res.stderr
    assert "address already in use" in errors[0]


def test_two_nodes_on_one_host_train_as_one_and_only_global_rank_0_writes(tmp_path):
    """A static two-node launch (torchrun on each "node", here both on loopback): each node's
    ``mindpipe run`` exits 0, the node that ran global rank 0 writes the trace, the other says
    where it is instead of failing on its own missing ``--out`` (and prints its one JSON object
    with ``out`` null), and the losses equal a one-host run of the same plan."""
    plan = {"dp": 2, "micro_batch_size": 1, "global_batch_size": 4, "precision": "fp32"}
    port = str(free_port())
    nodes = []
    for node in (0, 1):
        (tmp_path / f"tmp{node}").mkdir()
        cmd = [sys.executable, "-m", "mindpipe.cli", "run", json.dumps(plan), "--nproc", "1", "--steps", "2",
               "--model", json.dumps(TINY), "--out", str(tmp_path / f"node{node}.json"), "--nnodes", "2",
               "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", port, "--timeout", "120", "--json"]
        nodes.append(subprocess.Popen(cmd, env=run_env(TMPDIR=str(tmp_path / f"tmp{node}")), cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=300) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], [err[-2000:] for _, err in outputs]
    assert "the node that ran global rank 0 writes the measured trace" in outputs[1][1]
    assert not (tmp_path / "node1.json").exists()
    assert json.loads(outputs[0][0])["out"] == str(tmp_path / "node0.json")  # --json: one object on each node
    assert json.loads(outputs[1][0])["out"] is None
    two_nodes = json.loads((tmp_path / "node0.json").read_text())["measurement"]
    assert two_nodes["world_size"] == 2 and [s["step"] for s in two_nodes["steps"]] == [1, 2]
    one_host = tmp_path / "one"
    one_host.mkdir()
    res = run_plan(one_host, plan, 2, steps=2)
    assert res.returncode == 0, res.stderr[-3000:]
    expected = json.loads((one_host / "measured.json").read_text())["measurement"]["steps"]
    assert [s["loss"] for s in two_nodes["steps"]] == [s["loss"] for s in expected]
