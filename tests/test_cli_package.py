"""The CLI package: a module per subcommand, one loader per input kind, one fidelity report, no torch where not needed."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from mindpipe.simulator.calibrate.fidelity import FidelityRow, fidelity_report
from mindpipe.traces.errors import ContractError

from mindpipe.cli import SUBCOMMANDS, build_parser, loaders, main

PLAN = '{"dp":2,"pp":2,"micro_batch_size":2,"global_batch_size":16,"precision":"fp32"}'


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_one_module_per_subcommand_each_with_add_parser_and_cmd():
    parsers = _subparsers(build_parser())
    assert sorted(parsers) == sorted(["profile", "import", "inspect", "simulate", "tune", "calibrate", "validate",
                                      "run", "demo"])
    for module in SUBCOMMANDS:
        name = module.__name__.rsplit(".", 1)[1].rstrip("_")
        cmd = getattr(module, f"cmd_{name}")
        # The parser the module registered dispatches to the module's own handler.
        assert parsers[name].get_default("func") is cmd, name


def test_python_dash_m_mindpipe_is_the_mindpipe_command():
    """``python -m mindpipe`` (scripts not on PATH) behaves as ``mindpipe``: same program name, same exit codes."""
    ok = subprocess.run([sys.executable, "-m", "mindpipe", "--version"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout.startswith("mindpipe "), ok.stderr
    bad = subprocess.run([sys.executable, "-m", "mindpipe", "nosuch"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("mindpipe: error:") and len(bad.stderr.splitlines()) == 1, bad.stderr


def test_help_and_simulate_do_not_import_torch():
    code = f"""
import contextlib, io, json, sys
from mindpipe.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(["--help"])
    except SystemExit:
        pass
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(["simulate", "--model", "gpt-mini", "--cluster", "cpu:1x4", "--plan", {PLAN!r},
               "--trace", "gpt-mini.cpu", "--json"])
print(json.dumps({{"rc": rc, "result": json.loads(out.getvalue()), "torch": "torch" in sys.modules}}))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["rc"] == 0 and got["result"]["iteration_time_s"] > 0
    assert got["torch"] is False, "mindpipe --help or simulate imported torch"


def test_inspect_takes_a_shipped_trace_name(capsys):
    assert main(["inspect", "gpt-mini.cpu", "--model", "gpt-mini", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and json.loads(out)["model"] == "gpt-mini"
    assert main(["inspect", "gpt-mini.cpu", "--model", "gpt-13b"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mindpipe: error: gpt-mini.cpu: model: trace was taken for gpt-mini") and err.count("\n") == 1


def test_trace_loader_prefers_a_file_of_that_name(tmp_path, monkeypatch):
    loaders.trace("gpt-mini.cpu").save(tmp_path / "copy.json")
    data = json.loads((tmp_path / "copy.json").read_text())
    data["device"] = "my-laptop"
    (tmp_path / "gpt-mini.cpu").write_text(json.dumps(data))
    monkeypatch.chdir(tmp_path)
    assert loaders.trace("gpt-mini.cpu").device == "my-laptop"
    with pytest.raises(ContractError, match="no-such-trace"):
        loaders.trace("no-such-trace")


def test_optional_loaders_pass_none_through():
    assert loaders.calibration(None) is None
    assert loaders.carbon(None, "2024-01-01T00:00") is None


def _carbon_csv(tmp_path: Path) -> str:
    path = tmp_path / "zone.csv"
    path.write_text("Datetime (UTC),Carbon Intensity gCO₂eq/kWh (LCA)\n"
                    "2024-01-01 00:00:00,100\n2024-01-01 01:00:00,400\n", encoding="utf-8")
    return str(path)


def test_carbon_loader_reads_the_hour(tmp_path):
    series, when = loaders.carbon(_carbon_csv(tmp_path), "2024-01-01T01:30")
    assert [v for _, v in series] == [100.0, 400.0] and when.hour == 1


@pytest.mark.parametrize(("start", "needle"), [
    (None, "--start: --carbon-csv needs --start"),
    ("1 Jan 2024", "--start: '1 Jan 2024' is not an ISO date and time"),
])
def test_carbon_without_a_valid_start_is_one_line_exit_2(tmp_path, capsys, start, needle):
    args = ["simulate", "--model", "gpt-mini", "--cluster", "cpu:1x4", "--plan", PLAN, "--carbon-csv", _carbon_csv(tmp_path)]
    assert main(args + ([] if start is None else ["--start", start])) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and cap.err.startswith(f"mindpipe: error: {needle}")


def test_simulate_carbon_follows_the_hour(tmp_path, capsys):
    args = ["simulate", "--model", "gpt-mini", "--cluster", "cpu:1x4", "--plan", PLAN, "--json",
            "--carbon-csv", _carbon_csv(tmp_path), "--start"]
    carbon = []
    for start in ("2024-01-01T00:10", "2024-01-01T01:10"):
        assert main([*args, start]) == 0
        carbon.append(json.loads(capsys.readouterr().out)["carbon_gco2"])
    assert carbon[1] == pytest.approx(4 * carbon[0])


def _rows(prefix: str, n: int, calibrated: bool = True) -> list[FidelityRow]:
    return [FidelityRow(f"{prefix}{i}", f"dp{i + 1}·tp1·pp1 1f1b mb1", i + 1, 1.0 + i, 1.5 + i,
                        (1.05 + i) if calibrated else None) for i in range(n)]


def test_fidelity_report_held_out_and_fitted(tmp_path):
    printed = io.StringIO()
    files = fidelity_report(_rows("held", 2), _rows("fit", 3), report_dir=tmp_path / "r", title="Calibration fidelity",
                            preface=["Calibration: `cal.json`", ""], print_to=printed)
    assert [f.name for f in files] == ["fidelity.md", "calibration_scatter.png"]
    text = printed.getvalue()
    assert text.index("runs fitted on (in-sample):") < text.index("fit2") < text.index("held-out runs:") < text.index("held1")
    assert text.count("MAPE: uncalibrated") == 2
    md = files[0].read_text()
    assert md.startswith("# Calibration fidelity\n\nCalibration: `cal.json`\n")
    assert md.index("## Runs the calibration was fitted on") < md.index("| fit0") < md.index("## Held-out runs") < md.index("| held0")
    assert files[1].stat().st_size > 10_000


def test_fidelity_report_one_set_of_rows_no_files_no_print(tmp_path):
    printed = io.StringIO()
    assert fidelity_report(_rows("run", 2, calibrated=False), print_to=printed) == []
    text = printed.getvalue()
    assert "in-sample" not in text and "held-out" not in text and "run1" in text and ", calibrated" not in text
    assert fidelity_report(_rows("run", 2), report_dir=None, print_to=None) == []
    files = fidelity_report(_rows("run", 2), report_dir=tmp_path, title="Predicted vs measured (no calibration)")
    md = files[0].read_text()
    assert md.startswith("# Predicted vs measured (no calibration)\n\n| run |") and "##" not in md


def test_help_texts_say_what_the_commands_do():
    from mindpipe.tuner.keys import parse_global_batch

    parser = build_parser()
    parsers = _subparsers(parser)
    helps = {a.dest: a.help for a in next(a for a in parser._actions
                                           if isinstance(a, argparse._SubParsersAction))._choices_actions}
    # run: the one-host CPU launch forks its ranks (executor/launch.py uses_spawner), others go through torchrun
    assert "wraps torchrun" not in helps["run"] and "rank spawner" in helps["run"] and "torchrun" in helps["run"]

    def option_help(name: str, flag: str) -> str:
        return next(a.help for a in parsers[name]._actions if flag in a.option_strings) or ""

    assert "nemo-h100" in option_help("validate", "--data") and "vTrain" in option_help("validate", "--data")
    batch = option_help("tune", "--global-batch")
    assert "power-of-two range" not in batch and "doubling from A up to B" in batch
    assert "3:100 is 3,6,...,96" in batch and parse_global_batch("3:100") == [3, 6, 12, 24, 48, 96]
