"""A carbon, target or clock flag the chosen options do not use is refused (one line, exit 2),
not silently ignored."""

from __future__ import annotations

import contextlib
import io

import pytest

from mindpipe.cli import main as mindpipe_main

BASE = ["tune", "--model", "gpt-mini", "--cluster", "a100-sxm4-80gb:1x8", "--budget", "2", "--optimizer", "random",
        "--workers", "1", "--quiet", "--no-plots"]


def _run(tmp_path, *extra: str) -> tuple[int, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = mindpipe_main([*BASE, "--out", str(tmp_path / "sweep"), *extra])
    return code, stderr.getvalue()


@pytest.mark.parametrize(("extra", "message"), [
    (["--objective", "carbon", "--max-slowdown", "0.05"], "--max-slowdown: .*--clocks"),
    (["--objective", "energy", "--clocks", "default", "--max-slowdown", "0.05"], "--max-slowdown: .*--clocks"),
    (["--objective", "carbon", "--max-time-increase", "0.1"], "--max-time-increase: .*carbon_to_target"),
    (["--objective", "throughput", "--front-plans", "5"], "--front-plans: .*carbon_to_target"),
])
def test_an_unused_flag_is_one_line_and_exit_2(tmp_path, extra, message):
    code, err = _run(tmp_path, *extra)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "sweep").exists()  # refused before the sweep


@pytest.mark.parametrize("extra", [
    ["--objective", "carbon", "--clocks", "perseus", "--max-slowdown", "0.05"],
    ["--objective", "carbon", "--max-slowdown", "0.01"],  # the default, typed: nothing is lost
])
def test_the_flags_where_they_are_used_still_run(tmp_path, extra):
    code, err = _run(tmp_path, *extra)
    assert code == 0, err
