"""Context parallelism (the plan's ``cp``): contract, per-rank costs, the K/V ring, placement, memory, refusals."""

from __future__ import annotations

import dataclasses

import pytest
from mindpipe.simulator.api import simulate
from mindpipe.simulator.costs import TraceComputeModel, cp_collectives, op_layer_costs, roofline_time
from mindpipe.simulator.memory import model_state_bytes
from mindpipe.simulator.ops import block_ops
from mindpipe.simulator.topology import Topology
from mindpipe.traces.builtin import load_cluster, load_model
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Cluster, Model, Plan, check_plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.what_if import what_if_used

LLAMA = load_model("llama3-8b")  # s 8192, GQA 32/8
H100x8 = load_cluster("h100-sxm5-80gb:1x8")


def _plan(**kw) -> Plan:
    base = {"dp": 2, "tp": 2, "pp": 1, "cp": 2, "micro_batch_size": 1, "global_batch_size": 4, "flash_attention": True,
            "precision": "bf16"}
    return Plan(**{**base, **kw})


def test_contract_world_size_and_what_if() -> None:
    p = _plan()
    assert p.world_size == 8 and p.grad_replicas == 4 and p.num_microbatches == 2
    assert what_if_used(p) == [] and p.as_executed().cp == 2  # the executor runs it
    # TE's ring runs in the executor too (traces.torch_context_parallel): not a what-if knob.
    ring = _plan(cp_comm_type="p2p")
    assert what_if_used(ring) == [] and ring.as_executed().cp_comm_type == "p2p"
    with pytest.raises(ContractError, match="cp_comm_type"):
        _plan(cp_comm_type="a2a")
    check_plan(p, LLAMA, H100x8)
    with pytest.raises(ContractError, match="cp=2 needs flash_attention=true"):
        _plan(flash_attention=False)
    with pytest.raises(ContractError, match="cp=0 must be"):
        _plan(cp=0)
    odd = dataclasses.replace(LLAMA, seq_len=8190)
    with pytest.raises(ContractError, match=r"2×cp=4 does not divide seq_len=8190"):
        check_plan(_plan(), odd, H100x8)
    with pytest.raises(ContractError, match=r"dp×tp×pp×cp=2×2×1×2=8 does not equal the cluster's 2×8=16"):
        check_plan(_plan(), LLAMA, load_cluster("h100-sxm5-80gb:2x8"))


def test_a_rank_prices_its_share_of_the_sequence_and_the_whole_attention() -> None:
    s, cp = LLAMA.seq_len, 2
    whole = block_ops(LLAMA, 1, s, 2, flash_attention=True)
    share = block_ops(LLAMA, 1, s // cp, 2, flash_attention=True, cp=cp, cp_comm_type="p2p")

    def flops(ops, core: bool, phase: str | None = None) -> float:
        return sum(o.flops for o in ops if o.attention_core == core and phase in (None, o.phase))

    assert flops(share, False) == pytest.approx(flops(whole, False) / cp)  # GEMMs on s/cp tokens
    assert flops(share, True) == pytest.approx(flops(whole, True) / cp)  # balanced causal chunks
    # One fused kernel per step of the ring, in each direction.
    assert sum(o.kind == "flash" for o in share) == 2 * cp and sum(o.kind == "flash" for o in whole) == 2
    # The executor's all-gather: one masked kernel per query chunk over the keys up to it ((2·cp + 1)/(2·cp)
    # of the ring's pairs), and in the backward their forward again before their backward.
    for n in (2, 4, 8):
        ring = block_ops(LLAMA, 1, s // n, 2, flash_attention=True, cp=n, cp_comm_type="p2p")
        gathered = block_ops(LLAMA, 1, s // n, 2, flash_attention=True, cp=n)
        assert flops(gathered, False) == flops(ring, False)
        assert flops(gathered, True, "forward") == pytest.approx((2 * n + 1) / (2 * n) * flops(ring, True, "forward"))
        assert flops(gathered, True, "backward_input") == pytest.approx(3.5 * flops(gathered, True, "forward"))
        assert [o.phase for o in gathered if o.kind == "flash"] == ["forward"] * 2 + ["backward_input"] * 4
    with pytest.raises(ValueError, match="fused attention kernel only"):
        block_ops(LLAMA, 1, s // cp, 2, flash_attention=False, cp=cp)


def test_kv_ring_bytes_and_group() -> None:
    p = _plan(cp_comm_type="p2p")
    s_local = LLAMA.seq_len // 2
    fwd, bwd = cp_collectives(LLAMA, p, s_local, (1e-3, 2e-3))
    kv = 2 * 1 * LLAMA.seq_len * (LLAMA.kv_width // 2) * 2  # K and V of the whole sequence, local heads, bf16
    assert [(c.op, c.nbytes, c.axis, c.overlap_s) for c in fwd] == [("allgather", kv, "cp", 1e-3)]
    assert [(c.op, c.nbytes, c.axis, c.overlap_s) for c in bwd] == [("allreduce", kv, "cp", 2e-3)]
    # The executor's: the same bytes, blocking (nothing pipelined with the kernels).
    fwd, bwd = cp_collectives(LLAMA, _plan(), s_local, (1e-3, 2e-3))
    assert [(c.op, c.nbytes, c.axis, c.overlap_s) for c in fwd] == [("allgather", kv, "cp", 0.0)]
    assert [(c.op, c.nbytes, c.axis, c.overlap_s) for c in bwd] == [("allgather", kv, "cp", 0.0),
                                                                     ("reducescatter", kv, "cp", 0.0)]
    assert cp_collectives(LLAMA, dataclasses.replace(p, cp=1, cp_comm_type="allgather"), s_local) == ([], [])
    # The block's layer costs carry the ring in its attention part.
    layers = op_layer_costs(LLAMA, p, lambda ops: roofline_time(ops, 1e15, 2e12))
    block = next(c for c in layers if c.kind == "block")
    assert [c.axis for c in block.forward_comm].count("cp") == 1
    attention, mlp = block.parts
    # tp 2 without sequence parallelism: one all-reduce per sub-layer, the ring with the attention's.
    assert [(c.op, c.axis) for c in attention.forward_comm] == [("allreduce", "tp"), ("allgather", "cp")]
    assert [(c.op, c.axis) for c in mlp.forward_comm] == [("allreduce", "tp")]
    assert [(c.op, c.axis) for c in attention.backward_comm] == [("allreduce", "tp"), ("allreduce", "cp")]
    gathered = next(c for c in op_layer_costs(LLAMA, _plan(), lambda ops: roofline_time(ops, 1e15, 2e12))
                    if c.kind == "block")
    assert [(c.op, c.axis) for c in gathered.parts[0].backward_comm] == [
        ("allreduce", "tp"), ("allgather", "cp"), ("reducescatter", "cp")]


def test_cp_ranks_are_neighbours_inside_the_data_parallel_axis() -> None:
    p = _plan()
    t = Topology(p, H100x8, get_device(H100x8.gpu))
    # tp-cp-dp-pp: rank = tp + 2·(cp + 2·dp); the cp peer of rank 0 is rank 2, the dp peer rank 4.
    assert [t.global_rank(0, d, 0) for d in range(p.grad_replicas)] == [0, 2, 4, 6]
    ring = t.collective("allgather", 1000.0, "cp", 0)
    assert len(ring) == 1 and ring[0].link_type == "nvlink" and ring[0].group_size == 2
    assert ring[0].flows[0].links == (("nvout", 0), ("nvin", 2))
    assert t.collective("allreduce", 1000.0, "dp", 0)[0].group_size == 4  # gradients over dp·cp


def test_optimizer_shards_over_dp_times_cp() -> None:
    assert model_state_bytes(1e9, _plan(zero_stage=1)) == model_state_bytes(
        1e9, dataclasses.replace(_plan(zero_stage=1), cp=1, dp=4))


def test_simulated_memory_and_time_of_a_long_sequence() -> None:
    """Llama 3 8B at s 8192 on 8 H100: cp 2 holds half the activations of cp 1 at the same dp·cp."""
    cp2 = Plan(dp=4, cp=2, micro_batch_size=1, global_batch_size=32, flash_attention=True, zero_stage=1,
               cp_comm_type="p2p")
    cp1 = dataclasses.replace(cp2, cp=1, dp=8, cp_comm_type="allgather")  # no K/V exchange at cp=1
    a, b = simulate(LLAMA, H100x8, cp2), simulate(LLAMA, H100x8, cp1)
    acts = [s.activations_bytes for s in (a.extra.memory_by_stage[0], b.extra.memory_by_stage[0])]
    assert acts[0] == pytest.approx(acts[1] / 2, rel=0.02)
    assert a.peak_memory_gib < b.peak_memory_gib
    # Same work per device (dp·cp equal), plus the ring's exposed part: a little slower, not more.
    assert b.iteration_time_s < a.iteration_time_s < 1.2 * b.iteration_time_s
    assert a.extra.params_per_device_by_rank == b.extra.params_per_device_by_rank
    # The executor's all-gather: the same memory, slower (masked pairs, the re-run, the blocking exchange).
    c = simulate(LLAMA, H100x8, dataclasses.replace(cp2, cp_comm_type="allgather"))
    assert c.peak_memory_gib == pytest.approx(a.peak_memory_gib)
    assert c.iteration_time_s > 1.05 * a.iteration_time_s


def test_a_trace_cannot_price_cp() -> None:
    from mindpipe.traces.trace import LayerRecord, Provenance, Trace

    model = Model(kind="gpt", num_layers=1, hidden_size=64, num_heads=4, seq_len=64, vocab_size=128)
    recs = [LayerRecord(name=n, kind=k, forward_s=1e-3, backward_input_s=1e-3, backward_weight_s=1e-3)
            for n, k in (("embedding", "embedding"), ("block.0", "block"), ("lm_head", "lm_head"))]
    trace = Trace("a100-sxm4-80gb", "bf16", recs, Provenance("test"), micro_batch_size=1, seq_len=64,
                  flash_attention=True)
    with pytest.raises(ContractError, match="cp=2 needs the attention priced"):
        TraceComputeModel(trace).layer_costs(model, Plan(dp=1, cp=2, flash_attention=True))


def test_the_executor_takes_cp_and_its_rules() -> None:
    from mindpipe.executor.precheck import check_run

    model = Model(kind="gpt", num_layers=2, hidden_size=64, num_heads=4, seq_len=64, vocab_size=128)
    check_run(model, Plan(dp=1, cp=2, flash_attention=True), 2, "cpu", get_device("cpu"))
    with pytest.raises(ContractError, match=r"dp×tp×pp×cp=1×1×1×2=2 ranks needed, the launch has 4"):
        check_run(model, Plan(dp=1, cp=2, flash_attention=True), 4, "cpu", get_device("cpu"))
    with pytest.raises(ContractError, match=r"2×cp=8 does not divide seq_len=60"):
        check_run(dataclasses.replace(model, seq_len=60), Plan(dp=1, cp=4, flash_attention=True), 4, "cpu",
                  get_device("cpu"))


def test_supernet_plans_refuse_cp() -> None:
    from mindpipe.traces.builtin import load_supernet
    from mindpipe.traces.supernet import check_supernet_plan

    net = load_supernet("supernet-mini")
    plan = Plan(dp=1, cp=2, flash_attention=True, subnet_schedule="csp", subnet_window=2)
    with pytest.raises(ContractError, match="context parallelism is not modelled for supernets"):
        check_supernet_plan(plan, net, Cluster(gpu="cpu", num_nodes=1, gpus_per_node=2))


def test_the_tuner_searches_cp_on_request_and_pins_it_like_any_plan_key() -> None:
    from mindpipe.tuner.keys import check_fixes_what_if, parse_fixes, parse_search, parse_what_if

    assert parse_search("cp") == ("cp",) and "cp" not in parse_what_if("all")
    with pytest.raises(ContractError, match="cp is not a what-if knob: mindpipe run carries it out; search it with --search cp"):
        parse_what_if("cp")
    with pytest.raises(ContractError, match="tp is searched by default"):
        parse_search("tp")
    fixes = parse_fixes(["cp=2"])
    assert fixes == {"cp": 2}
    check_fixes_what_if(fixes, ())  # not a what-if knob


def test_simulate_names_the_what_if_knobs(capsys: pytest.CaptureFixture[str]) -> None:
    from mindpipe.cli import main

    assert main(["simulate", "--model", "gpt-mini", "--cluster", "cpu:1x2", "--plan",
                 '{"cp": 2, "flash_attention": true, "blocking_p2p": true}']) == 0
    out = capsys.readouterr().out
    assert "what-if knobs         blocking_p2p=true (simulated only" in out and "cp=2" not in out.split("what-if")[1]
    assert main(["simulate", "--model", "gpt-mini", "--cluster", "cpu:1x2", "--plan",
                 '{"dp": 2, "global_batch_size": 2}']) == 0
    assert "what-if" not in capsys.readouterr().out


def test_recomputing_the_core_runs_the_ring_again() -> None:
    from mindpipe.simulator.build import stage_recompute

    layers = op_layer_costs(LLAMA, _plan(), lambda ops: roofline_time(ops, 1e15, 2e12))
    blocks = [c for c in layers if c.kind == "block"][:2]
    for policy, axes in (("selective", ["cp"]), ("nongemm", ["cp"]), ("full", ["tp", "cp", "tp"])):
        _, comm, _ = stage_recompute(blocks, [policy] * 2)
        assert [c.axis for c in comm] == axes * 2, policy
    assert stage_recompute(blocks, ["none"] * 2)[1] == []


def test_a_swapped_block_copies_its_share_of_the_sequence() -> None:
    from mindpipe.simulator.planning import swap_bytes_per_block

    cp2 = _plan(dp=1)
    assert swap_bytes_per_block(LLAMA, cp2) == pytest.approx(swap_bytes_per_block(LLAMA, dataclasses.replace(cp2, cp=1)) / 2)
