"""A rank that fails ends the whole run with that rank's error, never a hang."""

from __future__ import annotations

from .conftest import run_env, run_plan

PLAN = {"pp": 2, "micro_batch_size": 1, "global_batch_size": 4, "precision": "fp32"}


def test_hard_crash_names_the_dead_rank(tmp_path):
    # Rank 1 dies at step 2 without a Python exception (os._exit): torchrun stops rank 0, and
    # the launcher reports rank 1 and its exit code.
    res = run_plan(tmp_path, PLAN, 2, "--schedule-source", "torch", steps=50,
                   env=run_env(MINDPIPE_FAULT="1:2:exit"))
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("mindpipe: error: rank 1 exited with code 17 without a Python error"), res.stderr[-3000:]
    assert not (tmp_path / "measured.json").exists()


def test_unresponsive_rank_times_out(tmp_path):
    # Rank 1 stops responding at step 2; rank 0's pipeline receive times out after --timeout,
    # its error is reported and the run ends instead of waiting forever.
    res = run_plan(tmp_path, PLAN, 2, "--schedule-source", "torch", "--timeout", "8", steps=50,
                   env=run_env(MINDPIPE_FAULT="1:2:hang"))
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("mindpipe: error: rank 0 failed: ") and "Timed out" in last, res.stderr[-3000:]


def test_a_crash_in_teardown_after_every_rank_finished_keeps_the_results(tmp_path):
    # Rank 1 aborts (SIGABRT, no Python error) after the run's last barrier, as torch's gloo teardown
    # sometimes does: the outputs are complete, so the run succeeds with a one-line warning.
    res = run_plan(tmp_path, PLAN, 2, "--schedule-source", "torch", steps=3,
                   env=run_env(MINDPIPE_FAULT="1:teardown"))
    assert res.returncode == 0, res.stderr[-3000:]
    warning = [ln for ln in res.stderr.splitlines() if ln.startswith("mindpipe: warning:")]
    assert len(warning) == 1 and "rank 1 was killed by SIGABRT" in warning[0], res.stderr[-3000:]
    assert "after every rank had finished the run" in warning[0]
    assert (tmp_path / "measured.json").exists()
