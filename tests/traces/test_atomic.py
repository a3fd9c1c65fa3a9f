"""Safe writes (traces.atomic): what each kind of target becomes, and what is never touched."""

from __future__ import annotations

import gzip
import os
import stat
import threading
from pathlib import Path

import pytest
from mindpipe.traces import atomic
from mindpipe.traces.atomic import open_append, open_output, output_dir, save_figure, write_text
from mindpipe.traces.errors import ContractError
from mindpipe.traces.schema import read_json, write_json


def _leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".tmp"))


def test_regular_file_is_replaced_whole_keeping_its_mode(tmp_path):
    out = tmp_path / "out.json"
    out.write_text("old")
    out.chmod(0o640)
    inode = out.stat().st_ino
    write_text(out, "new\n")
    assert out.read_text() == "new\n"
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert out.stat().st_ino != inode  # renamed into place, not rewritten in place
    assert _leftovers(tmp_path) == []


def test_a_failed_write_leaves_the_target_and_no_temporary_file(tmp_path):
    out = tmp_path / "out.json"
    out.write_text("old")
    with pytest.raises(RuntimeError, match="boom"), open_output(out) as fh:
        fh.write("half")
        raise RuntimeError("boom")
    assert out.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_planted_tmp_symlink_is_never_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out.json"
    (tmp_path / "out.json.tmp").symlink_to(victim)  # the old writer's fixed temporary name
    write_json({"a": 1}, out)
    assert victim.read_text() == "precious"
    assert read_json(out) == {"a": 1}
    assert (tmp_path / "out.json.tmp").is_symlink()


def test_a_planted_link_under_the_random_name_is_skipped_not_followed(tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    names = iter(["planted", "fresh"])
    monkeypatch.setattr(atomic.secrets, "token_hex", lambda n: next(names))
    (tmp_path / ".out.json.planted.tmp").symlink_to(victim)  # guessed the next name
    write_text(tmp_path / "out.json", "data")
    assert victim.read_text() == "precious" and (tmp_path / "out.json").read_text() == "data"


def _null_device(tmp_path: Path) -> Path:
    """A private copy of /dev/null where the test may create one (root), else /dev/null itself."""
    p = tmp_path / "null"
    try:
        os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError:
        return Path("/dev/null")
    return p


def test_a_character_device_stays_a_character_device(tmp_path):
    dev = _null_device(tmp_path)
    before = os.stat(dev)
    write_text(dev, "discarded\n")
    write_json({"x": 1}, dev)
    after = os.stat(dev)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino
    assert _leftovers(dev.parent) == []


def test_a_fifo_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write_json({"through": "the pipe"}, fifo)
    reader.join(timeout=30)
    assert not reader.is_alive() and got == [b'{\n "through": "the pipe"\n}\n']
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_a_fifo_nobody_reads_is_refused_in_bounded_time(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "FIFO_WAIT_S", 0.2)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ContractError, match=r"FIFO that nothing read within 0\.2 s"):
        write_text(fifo, "x")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_directory_is_refused_and_nothing_is_left_beside_it(tmp_path):
    d = tmp_path / "DIR"
    d.mkdir()
    with pytest.raises(ContractError, match="DIR: is a directory, expected a file"):
        write_json({"a": 1}, d)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["DIR"] and list(d.iterdir()) == []


def test_a_dangling_link_and_a_socket_are_refused(tmp_path):
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ContractError, match="symbolic link to nothing"):
        write_text(link, "x")
    assert not (tmp_path / "nowhere").exists()
    import socket

    sock_path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock_path))
        with pytest.raises(ContractError, match="is a socket"):
            write_text(sock_path, "x")


def test_a_link_to_a_regular_file_replaces_its_target_and_stays_a_link(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_missing_parent_is_one_line_unless_parents_are_made(tmp_path):
    with pytest.raises(ContractError, match="does not exist"):
        write_text(tmp_path / "a" / "b.json", "x")
    write_json({"k": 1}, tmp_path / "a" / "b.json")  # write_json makes parents, as it always did
    assert read_json(tmp_path / "a" / "b.json") == {"k": 1}


def test_gz_name_is_written_compressed(tmp_path):
    out = tmp_path / "t.json.gz"
    write_json({"k": [1, 2]}, out)
    assert gzip.decompress(out.read_bytes()) == b'{\n "k": [\n  1,\n  2\n ]\n}\n'
    assert read_json(out) == {"k": [1, 2]}


def test_output_dir_and_open_append_refuse_the_wrong_kind(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(ContractError, match="is a regular file, expected a directory"):
        output_dir(f)
    assert output_dir(tmp_path / "x" / "y").is_dir()
    link = tmp_path / "log.jsonl"
    link.symlink_to(f)
    with pytest.raises(ContractError, match="symbolic link"):
        open_append(link)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ContractError, match="FIFO"):
        open_append(fifo)
    with open_append(tmp_path / "new.jsonl") as fh:
        fh.write("a\n")
    assert (tmp_path / "new.jsonl").read_text() == "a\n"


def test_save_figure_refuses_an_unknown_format_before_writing(tmp_path):
    fig, _ = atomic.figure()
    with pytest.raises(ContractError, match=r"unsupported image format \.xyz"):
        save_figure(fig, tmp_path / "g.xyz")
    save_figure(fig, tmp_path / "g.svg")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.svg"]
    assert (tmp_path / "g.svg").read_text().lstrip().startswith("<?xml")


PLOTS_IN_A_NOTEBOOK = """
import sys
import matplotlib
matplotlib.use("svg")  # stands for a notebook's inline backend
from mindpipe.simulator.timeline import write_gantt
from mindpipe.traces.chrome_trace import TimelineEvent
from mindpipe.tuner.api import tune
from mindpipe.tuner.sweep import SweepConfig
write_gantt([TimelineEvent(0, "compute", "0F0", 0.0, 1.0, "F")], sys.argv[1] + "/g.png")
tune("gpt-mini", "cpu:1x2", out=sys.argv[1] + "/t", config=SweepConfig(optimizer="random", budget=2, workers=1))
print(matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules)
"""


def test_plots_leave_the_callers_matplotlib_backend_alone(tmp_path):
    # Library plots draw on pyplot-free figures: a notebook's backend stays what it was (calling
    # matplotlib.use("Agg") from a plot turned inline figures off for the rest of the session).
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", PLOTS_IN_A_NOTEBOOK, str(tmp_path)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["svg", "False"]
    assert (tmp_path / "g.png").stat().st_size > 0 and (tmp_path / "t" / "convergence.png").stat().st_size > 0


def test_check_output_creates_what_the_writer_would_and_leaves_nothing(tmp_path, monkeypatch):
    assert atomic.check_output(tmp_path / "new.json") is False
    (tmp_path / "old.json").write_text("{}")
    assert atomic.check_output(tmp_path / "old.json") is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]  # the probe files are gone

    def refused(path, flags, mode=0o777):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(atomic.os, "open", refused)  # e.g. a read-only directory: refused before any work
    with pytest.raises(ContractError, match=r"cannot create a file in .*: Permission denied"):
        atomic.check_output(tmp_path / "new.json")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_directory_that_makes_no_files_is_named_as_such_not_as_missing():
    with pytest.raises(ContractError, match=r"^/proc/mindpipe-x\.json: cannot create a file in /proc$"):
        atomic.check_output("/proc/mindpipe-x.json")


def test_a_name_ending_in_a_separator_is_refused_not_written_as_a_file(tmp_path):
    # Path("out/") is Path("out"): without the check the writer made a file where the user meant a directory.
    for name in ("new/", "old/"):
        if name == "old/":
            (tmp_path / "old").write_text("kept")
        target = f"{tmp_path}/{name}"
        with pytest.raises(ContractError, match="ends with a path separator"):
            atomic.check_output(target)
        with pytest.raises(ContractError, match="ends with a path separator"):
            write_text(target, "x")
        with pytest.raises(ContractError, match="ends with a path separator"):
            open_append(target)
    assert not (tmp_path / "new").exists()
    assert (tmp_path / "old").read_text() == "kept"
    assert _leftovers(tmp_path) == []
