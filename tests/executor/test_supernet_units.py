"""Supernet executor pieces in one process: the context switcher, the model-state budget, the config, the reference."""

from __future__ import annotations

import pytest
import torch
from mindpipe.executor.supernet_config import (
    MODEL_STATE_BYTES_PER_PARAM,
    SupernetRunConfig,
    check_memory_budget,
    is_supernet_config,
    stage_model_state_bytes,
)
from mindpipe.executor.supernet_reference import train_sequential
from mindpipe.executor.supernet_stage import combine_losses, make_optimizer, reduce_gradients
from mindpipe.executor.supernet_switch import ContextSwitcher
from mindpipe.traces.builtin import load_plan, load_supernet
from mindpipe.traces.errors import ContractError
from mindpipe.traces.schema import to_dict
from mindpipe.traces.torch_supernet import SupernetStage

NET = load_supernet("supernet-mini")


def _cfg(pp: int = 4, window: int = 2, switch: str = "on", **kw: object) -> SupernetRunConfig:
    plan = load_plan(f'{{"pp":{pp},"micro_batch_size":2,"global_batch_size":2,"subnet_window":{window}}}')
    return SupernetRunConfig(supernet=NET, plan=plan, steps=10, context_switch=switch, **kw)  # type: ignore[arg-type]


def test_switcher_moves_parameters_and_optimizer_state_without_changing_them() -> None:
    stage = SupernetStage(NET, 0, 2, first=True, last=False, seed=0)
    opt = make_optimizer([p for p in stage.parameters() if p.requires_grad], 1e-3, 0.0)
    key = "L0_2"
    before = {n: p.detach().clone() for n, p in stage.block(0, 2).named_parameters()}
    sw = ContextSwitcher(dict(stage.candidates.items()), [stage.embedding], opt, torch.device("cpu"), enabled=True)
    assert sw.resident == set() and all(p.numel() == 0 for p in stage.block(0, 2).parameters())
    emb = 4 * (NET.vocab_size + NET.seq_len) * NET.hidden_size  # frozen embeddings stay resident
    assert sw.peak_param_bytes == emb
    sw.ready([key])
    assert sw.resident == {key}
    assert all(torch.equal(p, before[n]) for n, p in stage.block(0, 2).named_parameters())
    x = torch.randn(2, NET.seq_len, NET.hidden_size)
    stage.block(0, 2)(x).sum().backward()
    opt.step()
    sw.measure([key])
    opt.zero_grad(set_to_none=True)
    p0 = next(stage.block(0, 2).parameters())
    moment = opt.state[p0]["exp_avg"].clone()
    sw.release(set())
    assert opt.state[p0]["exp_avg"].numel() == 0 and p0.numel() == 0  # state went to the host pool too
    sw.ready([key])
    assert torch.equal(opt.state[p0]["exp_avg"], moment)
    params = NET.candidates[2].param_count(NET.hidden_size) * 4
    assert sw.peak_param_bytes == emb + params
    assert sw.peak_state_bytes == emb + params * 4  # weights + grads + two moments


def test_switcher_off_keeps_everything_resident() -> None:
    stage = SupernetStage(NET, 0, 2, first=False, last=False, seed=0)
    opt = make_optimizer(stage.parameters(), 1e-3, 0.0)
    sw = ContextSwitcher(dict(stage.candidates.items()), [], opt, torch.device("cpu"), enabled=False)
    assert sw.resident == set(stage.candidates) and sw.peak_param_bytes == sw.total_param_bytes
    sw.release(set())
    assert sw.resident == set(stage.candidates)


def test_model_state_bound_by_hand() -> None:
    sizes = sorted((c.param_count(NET.hidden_size) for c in NET.candidates), reverse=True)
    h, v, s = NET.hidden_size, NET.vocab_size, NET.seq_len
    on, off = stage_model_state_bytes(_cfg()), stage_model_state_bytes(_cfg(switch="off"))
    per = MODEL_STATE_BYTES_PER_PARAM
    assert on[1] == 2 * sum(sizes[:3]) * per  # window 2 + 1 prefetched candidates per layer
    assert off[1] == 2 * sum(sizes) * per
    assert on[0] == on[1] + 4 * h * (v + s)  # frozen embeddings: weights only
    assert off[3] == off[1] + 4 * (2 * h + h * v)
    assert check_memory_budget(_cfg(memory_budget_gib=0.0024)) == on
    with pytest.raises(ContractError, match="without context switching"):
        check_memory_budget(_cfg(switch="off", memory_budget_gib=0.0024))


def test_config_rules_and_round_trip(tmp_path) -> None:
    assert _cfg(switch="auto").switching  # csp by default
    seq = load_plan('{"pp":2,"micro_batch_size":2,"global_batch_size":2,"subnet_schedule":"sequential"}')
    assert not SupernetRunConfig(supernet=NET, plan=seq, steps=4).switching
    with pytest.raises(ContractError, match="weight stashing"):
        SupernetRunConfig(supernet=NET, plan=load_plan('{"pp":2,"subnet_schedule":"async"}'), steps=4)
    sync = load_plan('{"pp":2,"subnet_schedule":"sync","subnet_window":4}')
    with pytest.raises(ContractError, match="multiple"):
        SupernetRunConfig(supernet=NET, plan=sync, steps=6)
    with pytest.raises(ContractError, match="global_batch_size"):
        SupernetRunConfig(supernet=NET, plan=load_plan('{"dp":2,"micro_batch_size":2,"global_batch_size":2}'), steps=4)
    cfg = _cfg()
    cfg.save(tmp_path / "c.json")
    assert is_supernet_config(to_dict(cfg)) and SupernetRunConfig.load(tmp_path / "c.json") == cfg


def test_dp_reduction_and_loss_combination() -> None:
    a = torch.nn.Parameter(torch.zeros(3))
    a.grad = torch.tensor([1.0, 2.0, 3.0])
    reduce_gradients([a], 2, lambda flat: flat.mul_(2))  # an all-reduce of two equal replicas
    assert torch.equal(a.grad, torch.tensor([1.0, 2.0, 3.0]))
    assert combine_losses([1.0, 2.0]) == 1.5


def test_reference_is_deterministic_and_trains() -> None:
    plan = load_plan('{"pp":2,"micro_batch_size":2,"global_batch_size":2}')
    a, b = train_sequential(NET, plan, 6), train_sequential(NET, plan, 6)
    assert [x.loss for x in a] == [y.loss for y in b]
    assert len({x.choices for x in a}) > 1


@pytest.mark.parametrize("plan", ['{"pp":2,"micro_batch_size":2,"global_batch_size":2}',
                                  '{"pp":2,"micro_batch_size":2,"global_batch_size":2,"subnet_window":3}',
                                  '{"pp":2,"micro_batch_size":2,"global_batch_size":2,"subnet_schedule":"sync"}'])
def test_the_simulator_times_the_table_the_executor_runs(plan: str) -> None:
    """One table (DESIGN.md): the simulator orders a plan's subnets with the window and sync batch the
    executor's config derives (``subnet_window``/``subnet_batch``), so a tuned plan runs as simulated."""
    from mindpipe.simulator.subnet_sim import SupernetSimulator
    from mindpipe.traces.builtin import load_cluster

    p = load_plan(plan)
    cfg = SupernetRunConfig(supernet=NET, plan=p, steps=8)
    result = SupernetSimulator(NET, load_cluster("cpu:1x2")).run(p, 8)
    assert (result.schedule, result.sync_batch) == (cfg.schedule, cfg.batch)
    if cfg.schedule == "csp":
        assert result.window == cfg.window
