"""Resuming a supernet checkpoint is checked against the supernet, not against one JSON spelling of it.

A checkpoint written before ``layer_candidates`` existed records a model document without the key;
the same supernet (no lists) must still resume, and one whose lists differ must still be refused in
one line naming ``layer_candidates``. The pre-launch check (:func:`precheck`) is the one ``mindpipe
run --resume`` makes before any rank starts; the ranks read their shards with the same document.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from mindpipe.executor import checkpoint_trust as trust
from mindpipe.executor.supernet_config import SupernetRunConfig, resume_model_document
from mindpipe.executor.supernet_launch import precheck
from mindpipe.traces.builtin import load_network
from mindpipe.traces.config import Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.schema import from_dict, to_dict
from mindpipe.traces.supernet import Supernet

PLAN = {"pp": 2, "micro_batch_size": 2, "global_batch_size": 2}


def _net(**changes: Any) -> Supernet:
    net = load_network("supernet-mini")
    assert isinstance(net, Supernet)
    return dataclasses.replace(net, **changes)


def _write_checkpoint(directory: Path, model: dict[str, Any], step: int = 30) -> None:
    """A complete checkpoint record of ``step`` written for ``model`` (no shard is read before the checks)."""
    trust.begin_save(directory, step)
    trust.step_dir(directory, step).mkdir(mode=0o700, exist_ok=True)
    (trust.step_dir(directory, step) / "stage0-dp0.pt").write_bytes(b"x")
    trust.finish_save(directory, step, model, 1)


def _cfg(net: Supernet, directory: Path) -> SupernetRunConfig:
    return SupernetRunConfig(supernet=net, plan=from_dict(Plan, PLAN), steps=60, out=None,
                             checkpoint_dir=str(directory), resume=True)


def test_checkpoint_from_before_layer_candidates_resumes(tmp_path: Path) -> None:
    net = _net()
    old = to_dict(net)
    old.pop("layer_candidates")  # what to_dict wrote before the key existed
    ckpt = tmp_path / "ckpt"
    _write_checkpoint(ckpt, old)
    precheck(_cfg(net, ckpt), 2, "plan")  # not refused as "another model" naming no difference
    assert trust.check_resume(ckpt, resume_model_document(ckpt, net), 1) == 30


def test_changed_layer_candidates_are_still_refused(tmp_path: Path) -> None:
    net = _net()
    names = [c.name for c in net.candidates]
    listed = _net(layer_candidates=[names[:3]] * 4 + [names[3:]] * 4)
    for written, resumed in ((net, listed), (listed, net),
                             (listed, _net(layer_candidates=[names[3:]] * 4 + [names[:3]] * 4))):
        ckpt = tmp_path / f"ckpt{id(written)}{id(resumed)}"
        doc = to_dict(written)
        if written.layer_candidates is None:
            doc.pop("layer_candidates")
        _write_checkpoint(ckpt, doc)
        with pytest.raises(ContractError, match=r"written for another model.*layer_candidates") as e:
            precheck(_cfg(resumed, ckpt), 2, "plan")
        assert "\n" not in str(e.value)
    assert resume_model_document(tmp_path / "missing", net) == to_dict(net)
