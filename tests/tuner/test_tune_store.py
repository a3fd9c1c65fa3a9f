"""The sweep's state on disk under hostile conditions: corrupted or foreign state on --resume is one
line and exit 2; a sweep that fails before evaluating anything leaves no state behind."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from mindpipe.traces.errors import ContractError
from mindpipe.tuner.api import tune
from mindpipe.tuner.store import CONFIG_NAME, RECORDS_NAME, SweepStore
from mindpipe.tuner.sweep import SweepConfig

from mindpipe.cli import main as mindpipe_main

SMALL = ('{"kind":"gpt","num_layers":8,"hidden_size":1024,"num_heads":16,"seq_len":512,"vocab_size":32000,'
         '"name":"gpt-small"}')
CLUSTER = "a100-sxm4-80gb:1x8"
FIXES = ["schedule=1f1b", "recompute=full", "zero_stage=0", "comm_priority=fair", "sequence_parallel=false"]
ARGS = ["--model", SMALL, "--cluster", CLUSTER, "--global-batch", "32", *[a for f in FIXES for a in ("--fix", f)],
        "--optimizer", "random", "--budget", "3", "--workers", "1", "--no-plots", "--quiet"]


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = mindpipe_main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 3-evaluation sweep: its state files are copied and damaged by each case."""
    out = tmp_path_factory.mktemp("store") / "sweep"
    code, _, err = _cli("tune", *ARGS, "--out", str(out))
    assert code == 0, err
    assert len((out / RECORDS_NAME).read_text().splitlines()) == 3
    return out


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in (CONFIG_NAME, RECORDS_NAME):
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


def _first_line(src: Path) -> dict:
    return json.loads((src / RECORDS_NAME).read_text().splitlines()[0])


CASES = {
    # (file damaged, new content from the good one, expected words in the one line)
    "truncated sweep.json": (CONFIG_NAME, lambda t, r: t[: len(t) // 2], "sweep.json: malformed JSON"),
    "sweep.json a list": (CONFIG_NAME, lambda t, r: "[1, 2]\n", "sweep.json: expected a JSON object, got list"),
    "sweep.json not UTF-8": (CONFIG_NAME, lambda t, r: b"\xff\xfe{".decode("latin-1"), "sweep.json"),
    "foreign sweep.json": (CONFIG_NAME, lambda t, r: '{"state_version": 2, "foo": 1}\n', "differs in"),
    "record is a list": (RECORDS_NAME, lambda t, r: "[1, 2, 3]\n" + t, "line 1: expected a JSON object, got list"),
    "record key is a list": (RECORDS_NAME, lambda t, r: json.dumps({**r, "key": [1, 2]}) + "\n" + t,
                             "line 1: key: does not match its point"),
    "foreign object": (RECORDS_NAME, lambda t, r: t + '{"hello": "world"}\n', "line 4: not an evaluation record"),
    "bad status": (RECORDS_NAME, lambda t, r: json.dumps({**r, "status": "great"}) + "\n",
                   "line 1: not an evaluation record (ValueError"),
    "metrics of another kind": (RECORDS_NAME, lambda t, r: json.dumps({**r, "metrics": {"speed": "fast"}}) + "\n",
                                "line 1: metrics"),
    "torn line in the middle": (RECORDS_NAME, lambda t, r: t.splitlines()[0][:40] + "\n" + t, "line 1: malformed JSON"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_damaged_state_on_resume_is_one_line_exit_2(finished, tmp_path, case):
    name, damage, needle = CASES[case]
    out = _copy(finished, tmp_path / "sweep")
    text = (out / name).read_text(encoding="latin-1")
    (out / name).write_bytes(damage(text, _first_line(finished)).encode("latin-1"))
    code, stdout, err = _cli("tune", *ARGS, "--out", str(out), "--resume")
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mindpipe: error: ") and needle in lines[0], err
    assert str(out) in lines[0] and "Traceback" not in err and stdout == ""


def test_bad_utf8_records_are_one_line(finished, tmp_path):
    out = _copy(finished, tmp_path / "sweep")
    (out / RECORDS_NAME).write_bytes(b"\xff\xfe\n" + (finished / RECORDS_NAME).read_bytes())
    code, _, err = _cli("tune", *ARGS, "--out", str(out), "--resume")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "evaluations.jsonl: line 1: not UTF-8 text" in err, err


def test_a_torn_last_line_is_dropped_and_a_complete_one_kept(finished, tmp_path):
    out = _copy(finished, tmp_path / "sweep")
    lines = (finished / RECORDS_NAME).read_text().splitlines()
    (out / RECORDS_NAME).write_text("\n".join(lines))  # the last line lost only its newline
    outcome = tune(SMALL, CLUSTER, out=out, global_batch=32, fixes=FIXES, resume=True, plots=False,
                   config=SweepConfig(optimizer="random", budget=3, workers=1))
    assert outcome.result.reused == 3
    (out / RECORDS_NAME).write_text("\n".join(lines[:2]) + "\n" + lines[2][:25])  # torn by a kill
    outcome = tune(SMALL, CLUSTER, out=out, global_batch=32, fixes=FIXES, resume=True, plots=False,
                   config=SweepConfig(optimizer="random", budget=3, workers=1))
    assert outcome.result.reused == 2
    again = (out / RECORDS_NAME).read_text().splitlines()  # the torn evaluation ran again, on a clean line
    assert again[:2] == lines[:2] and [json.loads(x)["key"] for x in again] == [json.loads(x)["key"] for x in lines]


def test_evaluations_without_sweep_json_are_refused(tmp_path):
    out = tmp_path / "sweep"
    out.mkdir()
    (out / RECORDS_NAME).write_text("")
    for resume in (False, True):
        with pytest.raises(ContractError, match=r"evaluations without sweep\.json"):
            SweepStore(out, {"x": 1}, resume=resume)



def test_resume_without_a_stored_sweep_says_it_starts_one(finished, tmp_path):
    # A mistyped --out with --resume: the sweep runs (a sweep killed before its first evaluation
    # stored nothing either), and says that nothing was resumed.
    code, out, err = _cli("tune", *ARGS, "--out", str(tmp_path / "typo"), "--resume", "--json")
    assert code == 0, err
    assert f"mindpipe: note: --resume: {tmp_path / 'typo'} holds no sweep yet (sweep.json); starting a new one" in err
    assert json.loads(out)["evaluations"] == 3
    code, out, err = _cli("tune", *ARGS, "--out", str(_copy(finished, tmp_path / "copy")), "--resume", "--json")
    assert code == 0 and "holds no sweep" not in err and json.loads(out)["reused"] == 3

def test_out_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "afile"
    f.write_text("keep")
    code, _, err = _cli("tune", *ARGS, "--out", str(f))
    assert code == 2 and "afile: is a regular file, expected a directory" in err, err
    assert f.read_text() == "keep"


def test_unreachable_dask_leaves_no_state(tmp_path):
    out = tmp_path / "sweep"
    with pytest.raises(ContractError, match="cannot reach the Dask scheduler"):
        tune(SMALL, CLUSTER, out=out, global_batch=32, fixes=FIXES, plots=False,
             config=SweepConfig(optimizer="random", budget=3, workers=1, dask="tcp://127.0.0.1:9", dask_timeout_s=1))
    assert not (out / CONFIG_NAME).exists() and not (out / RECORDS_NAME).exists()
    # The same command without --resume now runs (here on local workers).
    outcome = tune(SMALL, CLUSTER, out=out, global_batch=32, fixes=FIXES, plots=False,
                   config=SweepConfig(optimizer="random", budget=3, workers=1))
    assert outcome.result.simulations == 3 and (out / CONFIG_NAME).exists()
