"""``mindpipe run best_plan.json --model SUPERNET``: a tuned plan runs only on the supernet it was tuned for.

The GPT runner refuses a ``--model`` other than ``made_for.model``; the supernet runner took any
supernet, so a plan whose ``balanced`` partition was solved for one set of ``layer_candidates`` ran
silently on a supernet with other lists (or another pool). The label and the sampler seed may differ.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from mindpipe.executor.config import add_run_arguments
from mindpipe.executor.supernet_launch import supernet_config
from mindpipe.traces.builtin import load_cluster, load_supernet
from mindpipe.traces.config import MadeFor, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.schema import to_dict
from mindpipe.traces.supernet import Sampler, Supernet

BASE = load_supernet("supernet-mini")
NAMES = [c.name for c in BASE.candidates]
LISTED = dataclasses.replace(BASE, name=None, layer_candidates=[NAMES[:4]] * 4 + [NAMES[4:]] * 4)


def _args(tmp: Path, made: Supernet, model: Supernet) -> object:
    import argparse

    plan = Plan(pp=2, micro_batch_size=2, global_batch_size=2, partition=[3, 5], subnet_schedule="csp",
                made_for=MadeFor(None, load_cluster("cpu:1x2"), supernet=made))
    (tmp / "best_plan.json").write_text(json.dumps(to_dict(plan)))
    (tmp / "net.json").write_text(json.dumps(to_dict(model)))
    parser = argparse.ArgumentParser()
    add_run_arguments(parser, launcher=True)
    return parser.parse_args([str(tmp / "best_plan.json"), "--model", str(tmp / "net.json"), "--nproc", "2",
                              "--steps", "8", "--device", "cpu"])


@pytest.mark.parametrize(("made", "model", "what"), [
    (LISTED, dataclasses.replace(LISTED, layer_candidates=None), "layer_candidates"),
    (LISTED, dataclasses.replace(LISTED, layer_candidates=[NAMES[4:]] * 4 + [NAMES[:4]] * 4), "layer_candidates"),
    (LISTED, dataclasses.replace(LISTED, train_shared=True), "train_shared"),
    (BASE, dataclasses.replace(BASE, hidden_size=128), "hidden_size"),
])
def test_another_supernet_is_refused(tmp_path: Path, made: Supernet, model: Supernet, what: str) -> None:
    with pytest.raises(ContractError, match=rf"best_plan.json: made_for: the plan was tuned for the supernet .*{what}"):
        supernet_config(_args(tmp_path, made, model))


def test_same_supernet_under_another_label_or_seed_runs(tmp_path: Path) -> None:
    for model in (LISTED, dataclasses.replace(LISTED, name="mine", sampler=Sampler(seed=7))):
        cfg = supernet_config(_args(tmp_path, LISTED, model))
        assert cfg.supernet == model and cfg.plan.partition == [3, 5]
