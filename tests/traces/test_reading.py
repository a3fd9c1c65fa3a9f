"""The reading layer (:mod:`mindpipe.traces.reading`): regular files only, size limits, gzip, text, numbers."""

from __future__ import annotations

import gzip
import os
import socket
import zlib
from pathlib import Path

import pytest
from mindpipe.traces import reading
from mindpipe.traces.builtin import load_model
from mindpipe.traces.errors import ContractError
from mindpipe.traces.reading import (
    CONFIG,
    InputKind,
    parse_float,
    parse_int,
    parse_json,
    read_bytes,
    read_csv,
    read_json,
    read_text,
)

SMALL = InputKind("test input", 1000)
MODEL = '{"kind":"gpt","num_layers":%s,"hidden_size":256,"num_heads":8,"seq_len":128,"vocab_size":2048}'


def _refused(path: Path | str, needle: str, kind: InputKind = SMALL) -> str:
    with pytest.raises(ContractError) as e:
        read_bytes(path, kind)
    msg = str(e.value)
    assert msg.startswith(f"{path}: ") and needle in msg and "\n" not in msg, msg
    return msg


# -- what is read at all -----------------------------------------------------------------------------
def test_special_files_are_refused_before_they_are_opened(tmp_path, monkeypatch):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(reading.os, "open", lambda p, *a, **k: opened.append(str(p)) or real_open(p, *a, **k))
    _refused(fifo, "is a FIFO (named pipe), not a regular file")
    _refused("/dev/zero", "is a character device, not a regular file")
    _refused("/dev/null", "is a character device")
    _refused(tmp_path / "sock", "is a socket")
    _refused(tmp_path, "is a directory")
    _refused(tmp_path / "missing.json", "file not found")
    _refused(tmp_path / "missing" / "x.json", "file not found")
    assert opened == []  # none of them was opened
    sock.close()


def test_a_symlink_to_a_regular_file_is_read(tmp_path):
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    assert read_json(tmp_path / "link.json", SMALL) == {}
    (tmp_path / "zero").symlink_to("/dev/zero")
    _refused(tmp_path / "zero", "character device")


def test_size_limit_from_stat_and_while_reading(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 1001)
    msg = _refused(big, "file is 1001 bytes; test input input may be at most 1000 bytes (limit)")
    assert "(limit)" in msg
    (tmp_path / "ok.json").write_bytes(b" " * 999 + b"1")
    assert read_json(tmp_path / "ok.json", SMALL) == 1


def test_gzip_bomb_costs_at_most_the_limit(tmp_path):
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    body = c.compress(b"0" * (64 << 20)) + c.flush()  # 64 MiB of zeros in ~64 KiB
    (tmp_path / "bomb.json.gz").write_bytes(body)
    _refused(tmp_path / "bomb.json.gz", "gzip data decompresses to more than 1 MiB", CONFIG)


@pytest.mark.parametrize(("data", "needle"), [
    (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03garbage", "corrupt gzip data (Error -3"),
    # mtime=0: the header's timestamp is in the test id, which must match across pytest-xdist workers
    (gzip.compress(b'{"a": 1}' * 50, mtime=0)[:20], "corrupt gzip data: truncated"),
    (b'{"a": 1}', "has no gzip header"),
])
def test_corrupt_gzip_is_one_line(tmp_path, data, needle):
    (tmp_path / "x.json.gz").write_bytes(data)
    _refused(tmp_path / "x.json.gz", needle)


def test_gzip_by_magic_multi_member_and_padding(tmp_path):
    (tmp_path / "a.json").write_bytes(gzip.compress(b'{"a": ') + gzip.compress(b"[1, 2]}") + b"\x00" * 8)
    assert read_json(tmp_path / "a.json", SMALL) == {"a": [1, 2]}


def test_text_must_be_utf8_and_a_bom_is_dropped(tmp_path):
    (tmp_path / "x.json").write_bytes(b'{"a":\n "b\xff"}')
    with pytest.raises(ContractError, match=r"x\.json: line 2: not UTF-8 text \(byte 0xff at offset 9\)"):
        read_text(tmp_path / "x.json", SMALL)
    (tmp_path / "bom.json").write_bytes(b'\xef\xbb\xbf{"a": 1}')
    assert read_json(tmp_path / "bom.json", SMALL) == {"a": 1}


# -- numbers ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "rule"), [
    ("1e400", "num_layers: 1e400 is not a finite number"),
    ("-1e400", "num_layers: -1e400 is not a finite number"),
    ("NaN", "num_layers: NaN is not a finite number"),
    ("Infinity", "num_layers: Infinity is not a finite number"),
    ("-Infinity", "num_layers: -Infinity is not a finite number"),
    ("9" * 400, "num_layers: 999999999999...(400 characters) has more than 20 digits (limit)"),
    ("9" * 5000, "(5000 characters) has more than 20 digits"),
    ("true", "num_layers: must be an integer, got True"),
    ("1e300", "num_layers: must be an integer, got 1e+300"),
    ('"8"', "num_layers: must be an integer, got '8'"),
    ("123456789012345678", "outside ±2^53"),
    ("20000", "num_layers=20000 exceeds the limit of 16,384 transformer blocks"),
])
def test_json_numbers_are_strict_and_name_the_key(tmp_path, value, rule):
    path = tmp_path / "model.json"
    path.write_text(MODEL % value)
    with pytest.raises(ContractError) as e:
        load_model(str(path))
    assert str(e.value).startswith(f"{path}: ") and rule in str(e.value), str(e.value)


def test_refused_numbers_deep_in_a_document_name_their_path():
    with pytest.raises(ContractError, match=r"^t\.json: layers\[1\]\.stats\.x: NaN is not a finite number$"):
        parse_json('{"layers": [{}, {"stats": {"x": NaN}}]}', "t.json")
    assert parse_json('{"a": [1.5, -2, 12345678901234567890]}', "t.json") == {"a": [1.5, -2, 12345678901234567890]}


def test_inline_json_follows_the_same_rules():
    with pytest.raises(ContractError, match=r"^<inline model>: num_layers: 1e400 is not a finite number$"):
        load_model(MODEL % "1e400")
    with pytest.raises(ContractError, match="inline JSON is longer than 1 MiB"):
        load_model(MODEL % ("1" + " " * (1 << 20)))


def test_malformed_and_deep_json(tmp_path):
    with pytest.raises(ContractError, match=r"malformed JSON at line 1 column 2"):
        parse_json("{x", "f.json")
    with pytest.raises(ContractError, match="nested too deeply"):
        parse_json("[" * 200_000, "f.json")
    with pytest.raises(ContractError, match=r"f\.json: a: duplicate key 'a'"):
        parse_json('{"a": 1, "a": 2}', "f.json", unique_keys=True)


@pytest.mark.parametrize(("text", "ok"), [("12", 12), ("12.0", 12), (" 7 ", 7), ("1e3", None), ("nan", None),
                                          ("-1", None), ("9" * 30, None), ("1.5", None), ("", None)])
def test_parse_int(text, ok):
    if ok is None:
        with pytest.raises(ContractError, match=r"^f\.csv: k: .* is not a whole number in \[0, 100\]$"):
            parse_int(text, "f.csv", "k", 0, 100)
    else:
        assert parse_int(text, "f.csv", "k", 0, 100) == ok


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e400", "x", "1" * 100, "101", "-0.5"])
def test_parse_float_refuses(text):
    with pytest.raises(ContractError, match=r"^f\.csv: k: "):
        parse_float(text, "f.csv", "k", 0.0, 100.0)


# -- CSV ---------------------------------------------------------------------------------------------
def test_csv_field_and_row_limits(tmp_path):
    (tmp_path / "a.csv").write_text("h\n" + "1" * 200_000 + "\n")
    with pytest.raises(ContractError, match=r"a\.csv: line 2: malformed CSV \(field larger than field limit"):
        read_csv(tmp_path / "a.csv", InputKind("csv", 1 << 20))
    (tmp_path / "b.csv").write_text("h\n" + "1\n" * 11)
    with pytest.raises(ContractError, match=r"more than 10 rows after the header \(limit\)"):
        read_csv(tmp_path / "b.csv", SMALL, max_rows=10)
    assert len(read_csv(tmp_path / "b.csv", SMALL, max_rows=11)) == 12


def test_every_kind_has_a_limit_in_the_readme():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for kind in reading.KINDS:
        assert f"| {kind.name} | {reading.size_text(kind.max_bytes)} |" in readme, kind.name
