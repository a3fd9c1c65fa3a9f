"""The simulator against first principles: schedule rules and swap causality (BACKGROUND.md §1, §4.2)."""

from __future__ import annotations

import pytest
from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.config import Cluster, Model, Plan
from mindpipe.traces.errors import ContractError

MODEL = Model(kind="gpt", num_layers=8, hidden_size=64, num_heads=4, seq_len=32, vocab_size=128)


def test_dualpipev_microbatch_rule_names_the_plan_file_and_key() -> None:
    """DualPipeV needs m >= 2·pp (deepseek-ai/DualPipe, torch ScheduleDualPipeV). The check the CLI
    runs first (``Simulator.check``) must refuse it like the other micro-batch rules, naming the
    plan's file and the key the user sets, not ``plan: num_microbatches`` from deep in the run."""
    sim = Simulator(MODEL, Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=2))
    plan = Plan(pp=2, micro_batch_size=1, global_batch_size=3, schedule="dualpipev", virtual_stages=2)
    with pytest.raises(ContractError) as err:
        sim.check(plan, source="plan.json")
    assert err.value.source == "plan.json"
    assert err.value.key == "global_batch_size"
    assert "2·pp=4" in err.value.rule
    sim.check(Plan(pp=2, micro_batch_size=1, global_batch_size=4, schedule="dualpipev", virtual_stages=2))


def test_zb_h1_needs_equal_rounds_everywhere_so_the_tuner_returns_only_what_torch_runs(tmp_path) -> None:
    """torch's ScheduleInterleavedZeroBubble (the executor's ZB-H1) splits m micro-batches into
    max(1, m // pp) equal rounds. Only the executor's pre-launch check knew it: a sweep at global
    batch 9 on pp 4 returned m = 9, which ``mindpipe run`` then refused. The rule is now the plan's
    (``microbatch_rule``), so the simulator and the tuner's space refuse it too."""
    from mindpipe.traces.builtin import load_cluster, load_model
    from mindpipe.tuner.api import tune

    sim = Simulator(MODEL, Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=4))
    with pytest.raises(ContractError) as err:
        sim.check(Plan(pp=4, micro_batch_size=1, global_batch_size=9, schedule="zb_h1"), source="plan.json")
    assert err.value.key == "global_batch_size" and "multiple of max(1, m // pp)=2" in err.value.rule
    for m in (4, 5, 6, 7, 8, 10, 12):  # one round up to 2·pp − 1, then whole rounds
        sim.check(Plan(pp=4, micro_batch_size=1, global_batch_size=m, schedule="zb_h1"))
    with pytest.raises(ContractError) as err:
        tune(load_model("gpt-mini"), load_cluster("cpu:1x4"), out=tmp_path, global_batch=9,
             fixes=["pp=4", "schedule=zb_h1", "micro_batch_size=1"], plots=False)
    assert "zb_h1: m a multiple of max(1, m // pp)" in str(err.value)


def _swap_case(pp: int):
    """A GPT whose swapped blocks take far longer to copy than to compute (every block swapped)."""
    import simpy
    from mindpipe.simulator.network import FluidNetwork, Transfers

    model = Model(kind="gpt", num_layers=4, hidden_size=2048, num_heads=16, seq_len=2048, vocab_size=32000,
                  dropout=0.1)
    sim = Simulator(model, Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=pp))
    plan = Plan(pp=pp, micro_batch_size=2, global_batch_size=4, layer_memory_policy=["swap"] * 4)
    _, topo, stages, _, _ = sim.work(plan)
    env = simpy.Environment()
    copy_s = Transfers(env, FluidNetwork(env, topo.link_capacity), topo, sim.comm).time_alone(stages[-1].swap_out)
    return sim.run(plan, timeline=True), copy_s


@pytest.mark.parametrize("pp", [1, 2])
def test_swapped_activations_come_back_only_after_they_went_out(pp: int) -> None:
    """vPipe's swap: F(μ)'s activations go to the host after F(μ) and come back before its backward.
    On the last stage (and with pp = 1) the backward directly follows its own forward, so it cannot
    start before F(μ) ends plus a copy out plus a copy back (the executor's host→device copy waits
    for the device→host copy's event, executor/offload.py). The copy back used to start with the
    action before the backward — here F(μ) itself, before the bytes existed."""
    r, copy_s = _swap_case(pp)
    last = pp - 1
    tl = {e.name: e for e in r.timeline if e.rank == last and e.thread == "compute"}
    for mb in range(r.extra.num_microbatches):
        f, b = tl[f"{last}F{mb}"], tl[f"{last}B{mb}"]
        assert b.start_s >= f.end_s + 2 * copy_s - 1e-9, (mb, f, b, copy_s)


def test_copies_to_and_from_the_host_do_not_share_a_direction() -> None:
    """PCIe is full duplex (the catalog's ``pcie_bandwidth_GBps`` is per direction) and a GPU copies
    each way on its own copy engine: a copy to the host runs at its full rate while the copy of
    another micro-batch comes back. A swap-out that no other swap-out overlaps takes its time alone."""
    import simpy
    from mindpipe.simulator.network import FluidNetwork, Transfers

    model = Model(kind="gpt", num_layers=4, hidden_size=2048, num_heads=16, seq_len=2048, vocab_size=32000,
                  dropout=0.1)
    sim = Simulator(model, Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=2))
    plan = Plan(pp=2, micro_batch_size=4, global_batch_size=32, layer_memory_policy=["swap"] * 4)
    _, topo, stages, _, _ = sim.work(plan)
    env = simpy.Environment()
    alone = Transfers(env, FluidNetwork(env, topo.link_capacity), topo, sim.comm).time_alone(stages[0].swap_out)
    r = sim.run(plan, timeline=True)
    outs = sorted((e for e in r.timeline if e.rank == 0 and e.name.startswith("swap-out")), key=lambda e: e.start_s)
    solo = [e for e in outs if not any(o is not e and o.start_s < e.end_s and e.start_s < o.end_s for o in outs)]
    assert len(solo) >= 4
    for e in solo:
        assert e.end_s - e.start_s == pytest.approx(alone, rel=1e-6), e
    # the copies back are on the timeline too, per backward of the swapped stage: its last swapped
    # block's before it, the other one's during it
    ins = [e for e in r.timeline if e.rank == 0 and e.name.startswith("swap-in")]
    during = [e for e in ins if e.name.endswith("(during)")]
    assert len(ins) == 2 * len(during) == 2 * plan.num_microbatches and all(e.category == "swap" for e in ins)
