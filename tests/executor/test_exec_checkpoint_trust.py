"""A checkpoint is code (DCP unpickles ``.metadata``): anything tampered with, unlisted, or writable
by others is refused before torch reads a byte of it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from mindpipe.executor import checkpoint as ckpt
from mindpipe.executor.checkpoint_trust import MANIFEST, check_resume, repair_record
from mindpipe.traces.errors import ContractError
from torch.distributed.checkpoint.filesystem import FileSystemReader

from .conftest import TINY, free_port, run_plan

MODEL = {"kind": "toy", "name": "linear4"}


@pytest.fixture()
def one_rank():
    """A one-rank gloo process group in this process (DCP's save and load are collectives)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    port = free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _part(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    m = torch.nn.Linear(4, 4)
    return m, torch.optim.AdamW(m.parameters(), lr=1e-2)


def _saved(root: Path) -> Path:
    m, opt = _part(0)
    m(torch.ones(2, 4)).sum().backward()
    opt.step()
    ckpt.save(root, 3, [m], [opt], tp=1, model=MODEL)
    return root


class _Spy:
    """Stands in for torch's checkpoint readers and records whether anything reached them."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        raise AssertionError("torch's checkpoint reader was reached")


@pytest.fixture()
def spied(monkeypatch):
    spy = _Spy()
    monkeypatch.setattr(ckpt.dcp, "load", spy)
    monkeypatch.setattr(FileSystemReader, "read_metadata", spy)
    return spy


def _flip_byte(p: Path, at: int = 10) -> None:
    data = bytearray(p.read_bytes())
    data[at] ^= 0x01
    p.write_bytes(bytes(data))


DAMAGE = {
    "a byte of .metadata": (lambda s: _flip_byte(s / ".metadata"), "does not match manifest.json"),
    "a byte of a shard": (lambda s: _flip_byte(s / "__0_0.distcp", 200), "does not match manifest.json"),
    "manifest removed": (lambda s: (s / MANIFEST).unlink(), "no manifest.json"),
    "an unlisted file": (lambda s: (s / "evil.distcp").write_bytes(b"x"), "evil.distcp not in the manifest"),
    "a shard replaced by a link": (lambda s: ((s / "__0_0.distcp").unlink(), (s / "__0_0.distcp").symlink_to("/etc/hostname")),
                                   "not a regular file"),
    "a group-writable shard": (lambda s: (s / "__0_0.distcp").chmod(0o664), "writable by others"),
    "a world-writable step": (lambda s: s.chmod(0o777), "writable by others"),
    "a world-writable directory": (lambda s: s.parent.chmod(0o757), "writable by others"),
    "latest.json truncated": (lambda s: (s.parent / "latest.json").write_text('{"step": 3, "tp'), "malformed JSON"),
    "latest.json foreign": (lambda s: (s.parent / "latest.json").write_text('{"step": 3, "tp": 1, "complete": [3]}'),
                            "not a checkpoint record"),
}


def test_an_intact_checkpoint_loads(one_rank, tmp_path):
    root = _saved(tmp_path / "ck")
    assert json.loads((root / "step-3" / MANIFEST).read_text())["files"].keys() >= {".metadata", "__0_0.distcp"}
    m, opt = _part(1)
    assert ckpt.load(root, [m], [opt], tp=1, model=MODEL) == 3
    ref, _ = _part(0)
    assert not torch.equal(m.weight, ref.weight)  # the saved weights took one optimizer step away from seed 0


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_checkpoint_is_refused_before_torch_reads_it(one_rank, tmp_path, spied, case):
    root = _saved(tmp_path / "ck")
    damage, needle = DAMAGE[case]
    damage(root / "step-3")
    m, opt = _part(1)
    with pytest.raises(ContractError, match=needle) as e:
        ckpt.load(root, [m], [opt], tp=1, model=MODEL)
    assert "\n" not in str(e.value) and spied.calls == 0


def test_another_model_or_tp_is_refused_before_torch_reads_it(one_rank, tmp_path, spied):
    root = _saved(tmp_path / "ck")
    m, opt = _part(1)
    with pytest.raises(ContractError, match="written for another model"):
        ckpt.load(root, [m], [opt], tp=1, model={**MODEL, "name": "other"})
    # the keys that differ are named with both values, not the checkpoint's document cut off
    wider = {**MODEL, "kind": "gpt", "name": "wider"}
    with pytest.raises(ContractError, match=r"another model, linear4: kind \"toy\" \(this run: \"gpt\"\); "
                                            "this run trains wider"):
        ckpt.load(root, [m], [opt], tp=1, model=wider)
    with pytest.raises(ContractError, match="tp=1, this plan has tp=2"):
        ckpt.load(root, [m], [opt], tp=2, model=MODEL)
    assert spied.calls == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_files_of_another_user_are_refused(one_rank, tmp_path, spied):
    root = _saved(tmp_path / "ck")
    os.chown(root / "step-3" / "__0_0.distcp", 12345, -1)
    with pytest.raises(ContractError, match=r"belongs to another user \(uid 12345\)"):
        check_resume(root, MODEL, 1)
    assert spied.calls == 0


def test_mindpipe_run_refuses_a_tampered_checkpoint_before_any_rank_starts(tmp_path):
    plan = {"micro_batch_size": 1, "global_batch_size": 2, "precision": "fp32"}
    first = run_plan(tmp_path, plan, 1, "--checkpoint-dir", str(tmp_path / "ck"), steps=2)
    assert first.returncode == 0, first.stderr[-2000:]
    _flip_byte(tmp_path / "ck" / "step-2" / ".metadata")
    res = run_plan(tmp_path, plan, 1, "--checkpoint-dir", str(tmp_path / "ck"), "--resume", steps=4)
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "step-2/.metadata: does not match manifest.json" in lines[0], res.stderr
    assert "torch.distributed.run" not in res.stderr  # refused by the launcher: no rank ever started
    assert json.loads((tmp_path / "ck" / "latest.json").read_text())["model"]["name"] == TINY["name"]


def test_a_checkpoint_dcp_cannot_load_is_one_contract_error_naming_the_ranks_cause(one_rank, tmp_path, monkeypatch):
    """DCP raises a CheckpointException (a BaseException) that wraps each rank's own error: the run
    stops with that error in one line, not with the wrapper's list of ranks."""
    from torch.distributed.checkpoint.api import CheckpointException

    root = _saved(tmp_path / "ck")

    def failing(*args, **kwargs):
        # DCP's collectives give each rank's failure as an (exception, traceback) pair
        raise CheckpointException("load", {0: (RuntimeError("Missing key in checkpoint state_dict: optim.state.w.\nmore"),
                                               [])})

    monkeypatch.setattr(ckpt.dcp, "load", failing)
    m, opt = _part(1)
    with pytest.raises(ContractError, match=r"cannot load this checkpoint into the run's model: "
                                            r"Missing key in checkpoint state_dict: optim\.state\.w\.$"):
        ckpt.load(root, [m], [opt], tp=1, model=MODEL)


OTHER = {"kind": "toy", "name": "linear4-other"}


def test_each_step_resumes_only_into_the_run_it_was_written_for(one_rank, tmp_path, spied):
    """Two runs share a directory: step 3 of one model at tp 1, then step 1 of another at tp 2. The
    record's newest step is step 1, but resuming step 3 checks step 3's own model and TP degree."""
    root = _saved(tmp_path / "ck")
    m, opt = _part(0)
    ckpt.save(root, 1, [m], [opt], tp=2, model=OTHER)
    assert json.loads((root / "latest.json").read_text())["complete"] == [1, 3]
    assert check_resume(root, MODEL, 1, 3) == 3  # step 3 is the first run's: it resumes there
    assert check_resume(root, OTHER, 2) == 1  # the newest is the second run's
    with pytest.raises(ContractError, match=r"step-3: tp: checkpoint was written with tp=1, this plan has tp=2"):
        check_resume(root, MODEL, 2, 3)
    with pytest.raises(ContractError, match=r"ck: model: the checkpoint was written for another model, linear4-other"):
        check_resume(root, MODEL, 1, 1)
    assert spied.calls == 0


def test_a_step_written_again_leaves_the_record_until_it_is_whole(one_rank, tmp_path, monkeypatch):
    """Saving a step that is already complete takes it out of the record before its old manifest
    goes, so a save interrupted there leaves --resume the newest step that is still whole."""
    root = _saved(tmp_path / "ck")
    m, opt = _part(0)
    ckpt.save(root, 6, [m], [opt], tp=1, model=MODEL)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt.dcp, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save(root, 6, [m], [opt], tp=1, model=MODEL)
    record = json.loads((root / "latest.json").read_text())
    assert (record["step"], record["complete"]) == (3, [3])
    assert check_resume(root, MODEL, 1) == 3
    with pytest.raises(ContractError, match=r"no complete checkpoint of step 6 \(complete: \[3\]\)"):
        check_resume(root, MODEL, 1, 6)


def test_a_lost_record_is_rebuilt_from_the_steps_manifests(one_rank, tmp_path):
    """latest.json damaged or gone: the next save records every step whose manifest says what it
    was written for, instead of forgetting them."""
    root = _saved(tmp_path / "ck")
    (root / "latest.json").write_text("{not json")
    m, opt = _part(0)
    ckpt.save(root, 5, [m], [opt], tp=1, model=MODEL)
    assert json.loads((root / "latest.json").read_text())["complete"] == [3, 5]
    assert check_resume(root, MODEL, 1, 3) == 3


def test_a_resume_rebuilds_a_missing_or_damaged_record_from_the_manifests(one_rank, tmp_path):
    """Before a resume the launcher rebuilds a record that is gone or unreadable from the steps'
    manifests (each step is still verified when loaded); an intact or untrusted one is left alone,
    and a directory with no manifest to rebuild from still says there is nothing to resume."""
    root = _saved(tmp_path / "ck")
    m, opt = _part(0)
    ckpt.save(root, 5, [m], [opt], tp=1, model=MODEL)
    assert repair_record(root) == []
    for damage in ('{"step": 5, "tp', '{"step": 5, "tp": 1, "complete": [5]}', None):
        if damage is None:
            (root / "latest.json").unlink()
        else:
            (root / "latest.json").write_text(damage)
        notes = repair_record(root)
        assert len(notes) == 1 and notes[0].endswith("rebuilt from the manifests of steps [3, 5]"), notes
        assert json.loads((root / "latest.json").read_text()) == {"step": 5, "tp": 1, "complete": [3, 5], "model": MODEL}
        assert check_resume(root, MODEL, 1) == 5 and check_resume(root, MODEL, 1, 3) == 3
    (root / "latest.json").write_text("{not json")
    (root / "latest.json").chmod(0o666)
    with pytest.raises(ContractError, match="writable by others"):
        repair_record(root)
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o755)
    assert repair_record(empty) == []
    with pytest.raises(ContractError, match=r"no checkpoint to resume from \(latest.json missing\)"):
        check_resume(empty, MODEL, 1)


def test_two_runs_in_one_directory_each_resume_only_their_own_steps(tmp_path):
    """A tp=1 run leaves step 3; a tp=2 run, not resuming, then writes step 1 beside it (and is told
    the directory holds step 3). Resuming step 3 with tp=2 is refused by step 3's own record; with
    tp=1 it resumes (the folder's newest record is the tp=2 run's and does not decide)."""
    ck = str(tmp_path / "ck")
    tp1 = {"dp": 2, "micro_batch_size": 1, "global_batch_size": 2, "precision": "fp32"}
    tp2 = {"tp": 2, "micro_batch_size": 1, "global_batch_size": 1, "precision": "fp32"}
    first = run_plan(tmp_path, tp1, 2, "--checkpoint-dir", ck, steps=3)
    assert first.returncode == 0, first.stderr[-2000:]
    second = run_plan(tmp_path, tp2, 2, "--checkpoint-dir", ck, steps=1)
    assert second.returncode == 0, second.stderr[-2000:]
    assert f"mindpipe: note: {ck} already holds complete checkpoint steps [3]: this run does not resume" in second.stderr
    wrong = run_plan(tmp_path, tp2, 2, "--checkpoint-dir", ck, "--resume-from", "3", steps=4)
    assert wrong.returncode == 2 and wrong.stderr.strip().splitlines() == [
        f"mindpipe: error: {ck}/step-3: tp: checkpoint was written with tp=1, this plan has tp=2"], wrong.stderr[-2000:]
    right = run_plan(tmp_path, tp1, 2, "--checkpoint-dir", ck, "--resume-from", "3", steps=4)
    assert right.returncode == 0, right.stderr[-2000:]


def test_keep_checkpoints_keeps_the_newest_steps_and_records_only_those(one_rank, tmp_path):
    root = tmp_path / "ck"
    m, opt = _part(0)
    for step in (2, 4, 6, 8):
        ckpt.save(root, step, [m], [opt], tp=1, model=MODEL, keep=2)
    assert json.loads((root / "latest.json").read_text())["complete"] == [6, 8]
    assert sorted(p.name for p in root.glob("step-*")) == ["step-6", "step-8"]
    assert check_resume(root, MODEL, 1, 6) == 6
    ckpt.save(root, 4, [m], [opt], tp=1, model=MODEL, keep=2)  # a run resumed from earlier writes 4 again
    assert json.loads((root / "latest.json").read_text())["complete"] == [4, 8]  # the new step and the highest other
    ckpt.save(root, 10, [m], [opt], tp=1, model=MODEL)  # keep=0: every step stays
    assert json.loads((root / "latest.json").read_text())["complete"] == [4, 8, 10]


def test_mindpipe_run_keeps_only_the_newest_checkpoints_it_is_told_to(tmp_path):
    plan = {"dp": 2, "micro_batch_size": 1, "global_batch_size": 2, "precision": "fp32"}
    ck = tmp_path / "ck"
    res = run_plan(tmp_path, plan, 2, "--checkpoint-dir", str(ck), "--checkpoint-every", "1", "--keep-checkpoints", "2",
                   steps=4)
    assert res.returncode == 0, res.stderr[-2000:]
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-3", "step-4"]
    assert json.loads((ck / "latest.json").read_text())["complete"] == [3, 4]
    (ck / "latest.json").write_text('{"step": 4, "tp')  # a record cut short: the resume rebuilds it first
    again = run_plan(tmp_path, plan, 2, "--checkpoint-dir", str(ck), "--resume-from", "3", steps=5)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"mindpipe: note: {ck}/latest.json was unreadable (" in again.stderr
    assert "rebuilt from the manifests of steps [3, 4]" in again.stderr
