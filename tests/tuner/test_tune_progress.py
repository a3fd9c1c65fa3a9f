"""The progress lines a log (not a terminal) gets end on the sweep's final state.

Before: a grid sweep of a 21-point space under ``--budget 500`` logged one line, "1/500
simulations, best 15.251 samples/s", and nothing after, though it ran 21 simulations to a best of
31.446: lines were printed only at each new tenth of the budget, and the sweep ended in the first.
"""

from __future__ import annotations

import io

from mindpipe.tuner.progress import ProgressBar


def test_log_ends_on_the_last_state_when_the_space_runs_out_before_the_budget():
    out = io.StringIO()
    bar = ProgressBar("tune grid", "samples/s", stream=out)
    for done, best in ((1, 15.251), (2, 20.0), (21, 31.446)):
        bar(done, 500, best)
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("tune grid [") and "1/500 simulations, best 15.251 samples/s" in lines[0]
    assert "21/500 simulations, best 31.446 samples/s" in lines[-1]
    assert len(lines) == 2


def test_log_does_not_repeat_a_line_already_printed():
    out = io.StringIO()
    bar = ProgressBar("tune bo", "samples/s", stream=out)
    for done in range(1, 11):
        bar(done, 10, float(done))
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 10 and "10/10 simulations, best 10 samples/s" in lines[-1]
    bar.close()  # closing twice adds nothing
    assert out.getvalue().splitlines() == lines
