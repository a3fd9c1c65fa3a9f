"""A supernet whose layers choose from their own lists (``layer_candidates``) trains under CSP as sequential training does.

The space: ``supernet-mini``'s pool with attention and FFN candidates in the lower four layers and
the two convolutions in the upper four. Each stage must hold only its layers' candidates, every
subnet must choose within the lists, and the per-subnet losses must equal sequential single-process
training bit for bit. Online repartition, which models every layer at one mean cost, is refused.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from mindpipe.executor.supernet_reference import train_sequential
from mindpipe.traces.builtin import load_supernet
from mindpipe.traces.config import Plan
from mindpipe.traces.schema import from_dict, to_dict
from mindpipe.traces.supernet import Supernet
from mindpipe.traces.torch_supernet import build_supernet_stages
from mindpipe.traces.trace import Trace

from tests.executor.conftest import mindpipe, run_env

BASE = load_supernet("supernet-mini")
POOL = [c.name for c in BASE.candidates]
SPLIT_DATA = {**to_dict(BASE), "name": "mini-split", "layer_candidates": [POOL[:4]] * 4 + [POOL[4:]] * 4}
SPLIT = from_dict(Supernet, SPLIT_DATA)
PLAN = {"dp": 1, "pp": 2, "micro_batch_size": 2, "global_batch_size": 2, "subnet_schedule": "csp"}
N = 60


def _run(tmp: Path, *extra: str, out: str = "measured.json"):
    net = tmp / "split.json"
    net.write_text(json.dumps(SPLIT_DATA))
    env = run_env()
    (tmp / "tmp").mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp / "tmp")
    return mindpipe("run", json.dumps(PLAN), "--nproc", "2", "--steps", str(N), "--model", str(net), "--device", "cpu",
                    "--out", str(tmp / out), "--run-timeout", "500", "--timeout", "120", *extra, env=env)


def test_stages_hold_only_their_layers_candidates():
    split = build_supernet_stages(SPLIT, [4, 4], seed=0)
    full = build_supernet_stages(BASE, [4, 4], seed=0)
    assert sorted(split[1].candidates) == sorted(f"L{layer}_{k}" for layer in range(4, 8) for k in (4, 5))
    assert len(split[0].candidates) == 16 and len(full[0].candidates) == 24
    # The candidates a stage keeps are initialised as the full supernet's (seeded per layer and candidate).
    for key, block in split[0].candidates.items():
        for a, b in zip(block.parameters(), full[0].candidates[key].parameters(), strict=True):
            assert a.equal(b)


def test_csp_run_with_layer_lists_is_bit_identical_to_sequential(tmp_path: Path):
    res = _run(tmp_path)
    assert res.returncode == 0, res.stderr
    m = Trace.load(tmp_path / "measured.json").measurement
    assert m is not None and m.subnets is not None and m.subnet_stages is not None
    ref = train_sequential(SPLIT, from_dict(Plan, PLAN), N)
    assert [s.id for s in m.subnets] == list(range(N))
    for s in m.subnets:
        assert tuple(s.choices) == ref[s.id].choices
        assert all(k in SPLIT.layer_choices(layer) for layer, k in enumerate(s.choices))
        assert struct.pack("<f", s.loss) == struct.pack("<f", ref[s.id].loss), s.id
    stages = {r.stage: r for r in m.subnet_stages}
    built = build_supernet_stages(SPLIT, [4, 4], seed=0)
    for stage, module in enumerate(built):
        assert stages[stage].param_bytes == sum(p.numel() * 4 for p in module.parameters())


def test_online_repartition_is_refused_for_layer_lists(tmp_path: Path):
    res = _run(tmp_path, "--checkpoint-every", "20", "--repartition", "1.2", out="r.json")
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "repartition" in lines[0] and "layer_candidates" in lines[0], res.stderr
    assert not (tmp_path / "r.json").exists()
