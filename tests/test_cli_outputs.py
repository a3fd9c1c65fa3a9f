"""``--out`` as a careless or hostile user gives it: a device, a FIFO, a directory, a planted link.

Every command writes through :mod:`mindpipe.traces.atomic`; these run one real command
(``mindpipe import aicb``, a fraction of a second) against each kind of target.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

AICB = "traces/aicb_a100/L7B-M1-C04_Llama7B_megatron_tp2_pp1_mbs1_A100.txt"


def _import(src: Path, out: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mindpipe.cli", "import", "aicb", str(src), "--out", str(out)],
                          capture_output=True, text=True, cwd=cwd, timeout=300)


def _one_error_line(res: subprocess.CompletedProcess[str]) -> str:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("mindpipe: error: "), res.stderr
    return lines[0]


def test_out_dev_null_stays_dev_null(shared_data, tmp_path):
    before = os.stat("/dev/null")
    res = _import(shared_data / AICB, "/dev/null", tmp_path)
    assert res.returncode == 0, res.stderr
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)
    assert list(Path("/dev").glob(".null.*.tmp")) == [] and not Path("/dev/null.tmp").exists()


def test_out_fifo_is_written_through_and_stays_a_fifo(shared_data, tmp_path):
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    res = _import(shared_data / AICB, fifo, tmp_path)
    reader.join(timeout=60)
    assert res.returncode == 0, res.stderr
    assert not reader.is_alive() and json.loads(got[0])["layers"]  # the trace went through the pipe
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.fifo"]


def test_planted_tmp_symlink_target_is_untouched(shared_data, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "trace.json.tmp").symlink_to(victim)
    res = _import(shared_data / AICB, tmp_path / "trace.json", tmp_path)
    assert res.returncode == 0, res.stderr
    assert victim.read_text() == "precious\n"
    assert json.loads((tmp_path / "trace.json").read_text())["layers"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json", "trace.json.tmp", "victim.txt"]


@pytest.mark.parametrize("kind", ["directory", "dangling link"])
def test_out_that_cannot_be_a_file_is_refused_leaving_nothing(shared_data, tmp_path, kind):
    target = tmp_path / "DIR"
    if kind == "directory":
        target.mkdir()
    else:
        target.symlink_to(tmp_path / "nowhere")
    line = _one_error_line(_import(shared_data / AICB, target, tmp_path))
    assert str(target) in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["DIR"]  # no DIR.tmp, nothing created through the link


def test_reader_of_stdout_going_away_stops_quietly(shared_data):
    """``mindpipe validate ... | head -1``: the closed pipe ends the command as SIGPIPE would (141), with no error line.

    1,000 rows print about 120 KB, more than a pipe holds, so the command is still writing when the
    reader goes away.
    """
    csv = shared_data / "validation" / "vtrain_a100_single_node.csv"
    proc = subprocess.Popen([sys.executable, "-m", "mindpipe.cli", "validate", "vtrain-single", "--data", str(csv),
                             "--sample", "1000", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("row")
    proc.stdout.close()  # the reader goes away after one line
    err = proc.stderr.read() if proc.stderr is not None else ""
    assert proc.wait(timeout=300) == 141, err
    assert err == ""


def test_validate_progress_in_a_log_is_one_line_per_step(shared_data, capsys):
    # stderr captured (not a terminal): whole lines, no carriage returns joining them into one.
    from mindpipe.cli import main

    csv = shared_data / "validation" / "vtrain_a100_multi_node.csv"
    assert main(["validate", "vtrain-multi", "--data", str(csv), "--json"]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err
    assert err.splitlines() == ["simulated 50/109 rows", "simulated 100/109 rows", "simulated 109/109 rows"]


def _mindpipe(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
    return subprocess.run([sys.executable, "-m", "mindpipe.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300, env=env)


PLAN = {"dp": 2, "micro_batch_size": 1, "global_batch_size": 2, "precision": "fp32"}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--out", "plan.json"], "plan.json: is also this command's input plan.json: writing it would replace what it reads"),
        (["--out", "m.json", "--timeline", "m.json"], "m.json: is given for two outputs: the second would replace the first"),
        (["--out", "m.json", "--timeline", "./m.json"], "./m.json: is given for two outputs (also as m.json)"),
        (["--out", "/dev/null"], "/dev/null: is a device or pipe: rank 0's process writes this output"),
        (["--out", "m.json", "--checkpoint-every", "2"], "--checkpoint-every needs --checkpoint-dir"),
        (["--out", "m.json", "--checkpoint-dir", "/proc/ck"], "/proc/ck: cannot create this directory"),
    ],
    ids=["out-is-the-plan", "out-is-the-timeline", "same-file-two-names", "device", "every-without-dir",
         "uncreatable-checkpoint-dir"],
)
def test_run_refuses_outputs_that_collide_or_cannot_be_written_before_any_rank_starts(tmp_path, args, needle):
    """`run` writes at the end of training: a collision found then would cost the run (or the plan
    file it read), so it is refused first, in one line."""
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    res = _mindpipe("run", "plan.json", "--nproc", "2", "--steps", "2", "--model", "gpt-mini", *args, cwd=tmp_path)
    line = _one_error_line(res)
    assert needle in line, line
    assert json.loads((tmp_path / "plan.json").read_text()) == PLAN and not (tmp_path / "m.json").exists()
    assert "rank" not in line.split(needle)[0]  # the launcher's refusal, not a rank's


def test_calibrate_refuses_an_output_that_is_an_input_and_a_run_given_twice(tmp_path):
    """Both are refused before any file is read as a run (so the file's content does not matter)."""
    path = tmp_path / "m.json"
    path.write_text("{}")
    before = path.read_bytes()
    line = _one_error_line(_mindpipe("calibrate", "m.json", "--out", "m.json", cwd=tmp_path))
    assert line == "mindpipe: error: m.json: is also this command's input m.json: writing it would replace what it reads"
    assert path.read_bytes() == before
    line = _one_error_line(_mindpipe("calibrate", "m.json", "./m.json", "--out", "cal.json", cwd=tmp_path))
    assert line == "mindpipe: error: ./m.json: is given twice: each measured run counts once in the fit"
