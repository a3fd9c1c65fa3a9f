"""The README's example outputs are what the commands print today.

An example is a plain code block holding a ``mindpipe`` command (continued with ``\\``), a line
``...``, then lines of its output quoted verbatim. Each command runs as written, with
``../shared`` read as the published data beside the repo and ``--out`` in a temporary directory,
and every quoted line must be a line of what it prints: a change to the simulator that moves an
example's figures fails here until the README is re-made.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@dataclass(frozen=True)
class Example:
    line: int  # where the block starts in the README, for the test id
    argv: list[str]
    quoted: list[str]


def examples(text: str) -> list[Example]:
    """Every plain code block of the form command, ``...``, quoted output."""
    found = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.S | re.M):  # every fenced block, in pairs
        if m.group(1):
            continue  # a block in a named language (json, bash) is not an example
        body = m.group(2).splitlines()
        if "..." not in body or not body[0].startswith("mindpipe "):
            continue
        cut = body.index("...")
        command = " ".join(line.rstrip("\\").strip() for line in body[:cut])
        quoted = [line.rstrip() for line in body[cut + 1:] if line.strip()]
        found.append(Example(text[:m.start()].count("\n") + 1, shlex.split(command)[1:], quoted))
    return found


ALL = examples(README.read_text())


def test_the_readme_has_examples_to_check():
    assert len(ALL) >= 5 and all(e.quoted for e in ALL)


def test_examples_parse_a_block_as_written():
    text = "x\n```\nmindpipe tune --model m \\\n  --out d\n...\nbest value       1\n\n```\n"
    (e,) = examples(text)
    assert (e.line, e.argv, e.quoted) == (2, ["tune", "--model", "m", "--out", "d"], ["best value       1"])
    assert examples("```bash\nmindpipe tune --out d\n...\nx\n```\n") == []  # only plain blocks are examples


@pytest.mark.parametrize("example", ALL, ids=[f"README:{e.line}" for e in ALL])
def test_readme_example_prints_what_the_readme_quotes(example, tmp_path, shared_data):
    argv = [a.replace("../shared/data", str(shared_data)) for a in example.argv]
    if "--out" in argv:
        argv[argv.index("--out") + 1] = str(tmp_path / "out")
    res = subprocess.run([sys.executable, "-m", "mindpipe.cli", *argv], capture_output=True, text=True,
                         cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr
    printed = [line.rstrip() for line in res.stdout.splitlines()]
    missing = [q for q in example.quoted if q not in printed]
    assert not missing, f"README:{example.line} quotes lines the command no longer prints: {missing}"


def test_quoted_paths_are_the_repos_own():
    """Every example reads only built-ins and the published data (so CI can run it)."""
    for e in ALL:
        files = [a for a in e.argv if "/" in a and not a.startswith(("{", "2024-"))]
        outs = {e.argv[e.argv.index("--out") + 1]} if "--out" in e.argv else set()
        assert all(Path(f).as_posix().startswith("../shared/data/") for f in set(files) - outs), e.line
