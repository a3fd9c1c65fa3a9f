"""W in one autograd pass (executor/torch_pipelining.py: merge_weight_passes, merged_param_group).

torch's ``stage_backward_weight`` takes one pass per parameter group, and a checkpointed block
re-runs its forward in each (``traces.layout.weight_groups`` times, which the simulator prices);
the merged group must re-run each block once and give the same weight gradients bit for bit.
Checked on two blocks of the executor's own GPT and Llama, checkpointed as the executor
checkpoints them, with torch's I and W functions.
"""

from __future__ import annotations

import pytest
import torch
from mindpipe.executor.torch_pipelining import mergeable, merged_param_group
from mindpipe.traces.builtin import load_model
from mindpipe.traces.layout import weight_groups
from mindpipe.traces.torch_models import build_model
from torch import nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
from torch.utils.checkpoint import checkpoint


class Counted(nn.Module):
    """A block whose forward is checkpointed (non-reentrant, as the executor's) and counted."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block, self.runs = block, 0

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        self.runs += 1
        return self.block(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self._run, x, use_reentrant=False, preserve_rng_state=True)


def _split_backward(merge: bool, name: str = "gpt-mini") -> tuple[list[torch.Tensor], torch.Tensor, int, int]:
    model = load_model(name)
    torch.manual_seed(0)
    gpt = build_model(model, seed=0, dtype="fp32")
    made = [m for _, kind, m in gpt.layers() if kind == "block"][:2]
    blocks = nn.Sequential(*(Counted(b) for b in made))
    torch.manual_seed(1)
    x = torch.randn(2, 16, model.hidden_size, requires_grad=True)
    y = blocks(x)
    grad = torch.linspace(-1.0, 1.0, y.numel()).reshape(y.shape)
    runs = sum(b.runs for b in blocks)
    dx, groups = stage_backward_input([y], [grad], [x], blocks.parameters())
    after_i = sum(b.runs for b in blocks)
    assert groups is not None and mergeable(groups)
    if merge:
        groups = [merged_param_group(groups)]
    stage_backward_weight(blocks.parameters(), groups)
    after_w = sum(b.runs for b in blocks)
    assert after_i - runs == 2  # I re-runs each block once either way
    grads = [p.grad.clone() for p in blocks.parameters() if p.grad is not None]
    assert len(grads) == len(list(blocks.parameters()))
    return grads, dx[0].clone(), after_w - after_i, len(groups)


@pytest.mark.parametrize("name", ["gpt-mini", "llama-tiny"])
def test_merged_weight_pass_reruns_each_block_once_with_identical_gradients(name):
    per_group, dx_a, reruns_a, groups_a = _split_backward(False, name)
    merged, dx_b, reruns_b, groups_b = _split_backward(True, name)
    assert groups_a == 2 * weight_groups(load_model(name)) and groups_b == 1
    assert reruns_a == groups_a  # torch alone: one re-run of some block per group
    assert reruns_b == 2  # merged: each of the two blocks once
    assert torch.equal(dx_a, dx_b)
    for a, b in zip(per_group, merged, strict=True):
        assert torch.equal(a, b)  # bit for bit, not within a tolerance


def test_groups_without_saved_gradients_are_left_to_torch():
    one = {"params": [1], "intermediates": ["n"], "grads": [(None,)]}
    assert not mergeable([one])  # a single group: nothing to merge
    assert not mergeable(None)
    assert not mergeable([one, {"params": [2], "intermediates": ["m"]}])  # no "grads": I saw no gradient there
    assert not mergeable([one, {"params": [2], "intermediates": ["m"], "grads": [None]}])
    assert mergeable([one, {"params": [2], "intermediates": ["m"], "grads": [(None,)]}])
    assert merged_param_group([one, {"params": [2], "intermediates": ["m"], "grads": [(3,)]}]) == {
        "params": [1, 2], "intermediates": ["n", "m"], "grads": [(None,), (3,)]}
