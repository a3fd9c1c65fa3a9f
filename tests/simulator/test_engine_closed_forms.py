"""Closed forms the engine must reproduce with uniform layer costs and free communication."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest
from mindpipe.simulator.api import SimulationOptions, simulate
from mindpipe.simulator.build import GRAD_BYTES
from mindpipe.simulator.costs import DTYPE_BYTES, LayerCost
from mindpipe.simulator.perf.gpu import GpuComputeModel
from mindpipe.simulator.simulator import Simulator
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Cluster, Model, Plan
from mindpipe.traces.layout import copies_dp_buffers, data_parallel_units, gathers_before_forward


@dataclass
class Uniform:
    """Every block costs (f, i, w) per micro-batch; embedding, head and communication are free."""

    f: float = 1.0
    i: float = 1.0
    w: float = 1.0

    def layer_costs(self, model: Model, plan: Plan) -> list[LayerCost]:
        out = [LayerCost("embedding", "embedding", 0.0, 0.0, 0.0)]
        out += [LayerCost(f"block.{k}", "block", self.f, self.i, self.w) for k in range(model.num_layers)]
        out += [LayerCost("final_norm", "final_norm", 0.0, 0.0, 0.0), LayerCost("lm_head", "lm_head", 0.0, 0.0, 0.0)]
        return out

    def optimizer_step_s(self, params_per_device: int, plan: Plan) -> float:
        return 0.0


class FreeComm:
    """No latency and full link bandwidth: with zero-byte boundaries every transfer takes no time."""

    def latency_s(self, op: str, group_size: int, link: str) -> float:
        return 0.0

    def efficiency(self, op: str, nbytes: int, group_size: int, link: str) -> float:
        return 1.0


def _run(schedule: str, p: int, m: int, v: int = 1, cost: Uniform | None = None, layers_per_stage: int = 1):
    model = Model(kind="gpt", num_layers=p * v * layers_per_stage, hidden_size=64, num_heads=4, seq_len=32,
                  vocab_size=128)
    cluster = Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=p)
    plan = Plan(pp=p, micro_batch_size=1, global_batch_size=m, schedule=schedule, virtual_stages=v)
    return simulate(model, cluster, plan, SimulationOptions(compute=cost or Uniform(), comm=FreeComm()))


GRID = [(p, k * p) for p in (2, 4, 8) for k in (1, 2, 4)]


@pytest.mark.parametrize(("p", "m"), GRID)
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(schedule: str, p: int, m: int) -> None:
    r = _run(schedule, p, m, cost=Uniform(1.0, 2.0, 0.0))
    assert r.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-9)
    # Step = (m + p − 1)(t_f + t_b) (GPipe paper / Narayanan et al. §2.2.1).
    assert r.iteration_time_s == pytest.approx((m + p - 1) * 3.0, abs=1e-9)


@pytest.mark.parametrize(("p", "m"), GRID)
@pytest.mark.parametrize("v", [2, 4])
def test_interleaved_bubble_is_p_minus_1_over_v_m_of_ideal(p: int, m: int, v: int) -> None:
    # Each chunk is one block: per rank and micro-batch t_f = v·1, t_b = v·2 over all its chunks.
    r = _run("interleaved_1f1b", p, m, v, cost=Uniform(1.0, 2.0, 0.0))
    ideal = m * v * 3.0
    bubble = r.iteration_time_s - ideal
    assert bubble / ideal == pytest.approx((p - 1) / (v * m), abs=1e-9)


@pytest.mark.parametrize(("p", "m"), GRID)
def test_zb_h1_bubble_follows_qi_et_al(p: int, m: int) -> None:
    # Qi et al. (ICLR'24): ZB-H1 bubble (p−1)(T_F + T_B − T_W), T_B the input gradient (our I).
    f, i, w = 1.0, 1.0, 1.0
    r = _run("zb_h1", p, m, cost=Uniform(f, i, w))
    bubble = r.iteration_time_s - m * (f + i + w)
    assert bubble == pytest.approx((p - 1) * (f + i - w), abs=1e-9)
    one_f_one_b = _run("1f1b", p, m, cost=Uniform(f, i + w, 0.0))
    assert r.iteration_time_s < one_f_one_b.iteration_time_s


class P2pLatency(FreeComm):
    """Pipeline sends take ``c`` seconds (latency; the few-KB boundaries add ~1e-8 s); the rest is free."""

    def __init__(self, c: float) -> None:
        self.c = c

    def latency_s(self, op: str, group_size: int, link: str) -> float:
        return self.c if op == "p2p" else 0.0


def _p2p_run(blocking: bool, c: float, p: int = 2, m: int = 2, record: bool = False):
    model = Model(kind="gpt", num_layers=p, hidden_size=64, num_heads=4, seq_len=32, vocab_size=128)
    cluster = Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=p)
    plan = Plan(pp=p, micro_batch_size=1, global_batch_size=m, schedule="1f1b", blocking_p2p=blocking)
    opts = SimulationOptions(compute=Uniform(1.0, 2.0, 0.0), comm=P2pLatency(c), timeline=record)
    return simulate(model, cluster, plan, opts)


def test_blocking_p2p_holds_the_sender_until_its_send_lands() -> None:
    # 1F1B, p = 2, m = 2, F = 1, B = 2, each send 0.5 (worked by hand).
    # In flight: stage 1 runs F1 right after B0 (act 1 landed at 2.5), so the step is 10.0.
    # Blocking (Megatron): stage 1 waits for grad 0 to land (4.5 → 5.0) before F1, so B1's gradient
    # reaches stage 0 at 8.5 and the step ends at 10.5.
    assert _p2p_run(False, 0.5).iteration_time_s == pytest.approx(10.0, abs=1e-6)
    assert _p2p_run(True, 0.5).iteration_time_s == pytest.approx(10.5, abs=1e-6)
    # Free sends: nothing to wait for, both semantics give (m + p − 1)(F + B).
    assert _p2p_run(True, 0.0).iteration_time_s == pytest.approx(_p2p_run(False, 0.0).iteration_time_s, abs=1e-6)


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8)])
def test_blocking_p2p_timeline_no_action_starts_before_the_previous_send_lands(p: int, m: int) -> None:
    r = _p2p_run(True, 0.25, p, m, record=True)
    sends = 0
    for rank in range(p):
        mine = sorted((e for e in r.timeline if e.rank == rank), key=lambda e: e.start_s)
        for e in (x for x in mine if x.category == "p2p"):
            sends += 1
            nxt = [x for x in mine if x.thread == "compute" and x.start_s >= e.start_s]
            assert not nxt or nxt[0].start_s >= e.end_s - 1e-9, (rank, e, nxt[0])
    assert sends == 2 * (p - 1) * m
    assert r.iteration_time_s > _p2p_run(False, 0.25, p, m).iteration_time_s


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_without_pipelining_reduces_every_microbatch_and_gathers_again(zero: int) -> None:
    """FSDP2's per-micro-batch reduction (traces/layout.py reduces_every_microbatch): one
    reduce-scatter of the stage's buckets in every backward, and the weights gathered again, module
    by module, before every forward but the first (ZeRO-3 also before every backward). With
    pipelining, one reduction per step."""
    model = Model(kind="gpt", num_layers=2, hidden_size=64, num_heads=4, seq_len=32, vocab_size=128)
    cluster = Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=4)
    m = 3
    plan = Plan(dp=2, micro_batch_size=1, global_batch_size=2 * m, zero_stage=zero)
    r = simulate(model, Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=2), plan,
                 SimulationOptions(timeline=True))
    names = [e.name for e in r.timeline if e.category == "dp"]
    reduces = [n for n in names if n.startswith("grad-reduce")]
    gathers = [n for n in names if n.startswith("param-gather stage")]  # not the post-step gather
    buckets = len({n for n in reduces})
    assert buckets >= 1 and len(reduces) == m * buckets
    # Gathers go per sharded module (FSDP2's units: the stage's own parameters, then each block).
    units = data_parallel_units(plan, model.num_layers)
    assert units == 1 + model.num_layers
    # ZeRO-2: m gathers in the step (FSDP2 reshards after the last backward: the first forward
    # gathers too); ZeRO-3: m + m.
    assert len(gathers) == (m if zero == 2 else 2 * m) * units
    piped = simulate(model, cluster, Plan(dp=2, pp=2, micro_batch_size=1, global_batch_size=2 * m, zero_stage=zero),
                     SimulationOptions(timeline=True))
    issued = [(e.rank, e.name) for e in piped.timeline if e.category == "dp" and e.name.startswith("grad-reduce")]
    assert issued and len(issued) == len(set(issued))  # each stage's buckets once per step


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_without_pipelining_one_microbatch_reduces_during_its_backward(zero: int) -> None:
    """With one micro-batch too, FSDP2 reduce-scatters each module's gradients as the backward
    produces them (traces/layout.py reduces_every_microbatch), not after it (torch's pipelining
    runtime's behaviour, which the executor turns off): the first bucket's reduction starts while
    the backward still runs, whatever ``overlap_grad_reduce`` says."""
    model = Model(kind="gpt", num_layers=4, hidden_size=2048, num_heads=16, seq_len=512, vocab_size=1024)
    cluster = Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=2)
    plan = Plan(dp=2, micro_batch_size=4, global_batch_size=8, zero_stage=zero, overlap_grad_reduce=False)
    assert plan.num_microbatches == 1
    r = simulate(model, cluster, plan, SimulationOptions(timeline=True))
    tl = [e for e in r.timeline if e.rank == 0]
    backward = next(e for e in tl if e.thread == "compute" and e.category == "B")
    reduces = sorted((e for e in tl if e.name.startswith("grad-reduce")), key=lambda e: e.start_s)
    assert len(reduces) >= 2
    assert reduces[0].start_s < backward.end_s - 1e-9


@pytest.mark.parametrize("nic_gbps", [400.0, 0.5], ids=["gathers_hidden", "gathers_exposed"])
def test_zero3_gathers_each_module_ahead_of_its_compute(nic_gbps: float) -> None:
    """FSDP2's prefetch on dedicated devices: before a ZeRO-3 action only the first module's
    all-gather is exposed; the others run one after another under the action's compute, and the
    action ends no earlier than the last module's share of its compute after that module's gather.
    With a fast network the action is its first gather plus its compute; with a slow one the gathers
    set its length. (Ranks sharing a CPU host's cores gather every module first.) Each gathering
    action's compute also copies the gathered weights out of the all-gather buffer (FSDP2's
    copy-out): every byte read and written once at the GPU model's achieved bandwidth; each
    backward also copies its gradients into the reduce-scatter's fp32 buffer (FSDP2's copy-in)."""
    model = Model(kind="gpt", num_layers=4, hidden_size=512, num_heads=8, seq_len=256, vocab_size=1024)
    cluster = Cluster(gpu="a100-sxm4-80gb", num_nodes=2, gpus_per_node=1, inter_node_bandwidth_Gbps=nic_gbps)
    plan = Plan(dp=2, micro_batch_size=2, global_batch_size=8, zero_stage=3)
    r = simulate(model, cluster, plan, SimulationOptions(timeline=True))
    tl = [e for e in r.timeline if e.rank == 0]
    # Megatron-style replicas reduce in place: no gathers and no copies.
    replicated = simulate(model, cluster, dataclasses.replace(plan, zero_stage=0, dp_impl="megatron"),
                          SimulationOptions(timeline=True))
    compute = {(e.category, e.name): e.end_s - e.start_s for e in replicated.timeline
               if e.rank == 0 and e.thread == "compute" and e.category in ("F", "B")}
    units = data_parallel_units(plan, model.num_layers)
    (stage,) = Simulator(model, cluster).work(plan)[2]
    weights = r.extra.params_per_device_by_rank[0] * DTYPE_BYTES[plan.precision]
    copy = 2 * weights / GpuComputeModel(get_device(cluster.gpu)).kernel_params(plan.precision).bandwidth_Bps
    assert stage.gather_copy_s == pytest.approx(copy, rel=1e-12) and copy > 0
    grads = r.extra.params_per_device_by_rank[0] * (DTYPE_BYTES[plan.precision] + GRAD_BYTES[plan.precision])
    copy_in = grads / GpuComputeModel(get_device(cluster.gpu)).kernel_params(plan.precision).bandwidth_Bps
    assert stage.reduce_copy_s == pytest.approx(copy_in, rel=1e-12) and copy_in > 0
    actions = [e for e in tl if e.thread == "compute" and e.category in ("F", "B")]
    gathers = [e for e in tl if e.name.startswith("param-gather stage")]
    assert len(gathers) == 2 * plan.num_microbatches * units and len(actions) == 2 * plan.num_microbatches
    for a in actions:
        mine = [g for g in gathers if a.start_s - 1e-12 <= g.end_s and g.start_s <= a.end_s + 1e-12
                and not (g.name.endswith(" unit 0") and g.end_s > a.start_s + 1e-12)]
        first = [g for g in mine if g.name.endswith(" unit 0")]
        rest = [g for g in mine if not g.name.endswith(" unit 0")]
        assert len(rest) == units - 1, (a, mine)
        assert all(g.start_s >= a.start_s - 1e-12 for g in rest)  # under the action
        if first:
            assert first[0].end_s <= a.start_s + 1e-12  # the first one before it
        assert a.end_s >= max(g.end_s for g in rest) - 1e-12
        # Its compute alone: the same action under in-place replication (nothing gathered or copied).
        c = compute[(a.category, a.name)] + copy + (copy_in if a.category == "B" else 0.0)
        last = max(g.end_s for g in rest)
        assert a.end_s == pytest.approx(max(a.start_s + c, last + c / units), rel=1e-9, abs=1e-12)
        if nic_gbps > 100:
            assert a.end_s - a.start_s == pytest.approx(c, rel=1e-9)  # every later gather hidden
        else:
            assert a.end_s == pytest.approx(last + c / units, rel=1e-9)  # the gathers set its length


@pytest.mark.parametrize(("zero", "pp", "dp", "precision", "impl", "copies"), [
    (3, 1, 2, "bf16", "fsdp2", True),     # fully_shard: gathered before every forward and backward
    (2, 1, 2, "bf16", "fsdp2", True),     # resharded after each backward, gathered again
    (3, 2, 2, "bf16", "fsdp2", True),     # gathered once, before the stage's first forward
    (0, 1, 2, "bf16", "fsdp2", True),     # replicate: its unshard copies the replica too
    (1, 2, 2, "bf16", "fsdp2", True),
    (0, 1, 1, "bf16", "fsdp2", True),     # one replica in bf16: the wrapper still casts and copies
    (0, 1, 1, "fp32", "fsdp2", False),    # one fp32 replica: no wrapper (data_parallel_units)
    (0, 1, 2, "bf16", "megatron", False),  # Megatron's contiguous buffers: reduced and gathered in place
    (1, 2, 2, "bf16", "megatron", False),
])
def test_stages_under_fsdp2_copy_their_weights_and_gradients(zero: int, pp: int, dp: int, precision: str,
                                                             impl: str, copies: bool) -> None:
    model = Model(kind="gpt", num_layers=4, hidden_size=512, num_heads=8, seq_len=256, vocab_size=1024)
    cluster = Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=dp * pp)
    plan = Plan(dp=dp, pp=pp, micro_batch_size=2, global_batch_size=8, zero_stage=zero, precision=precision,
                dp_impl=impl)
    assert copies_dp_buffers(plan) == copies
    _, _, stages, _, params_by_rank = Simulator(model, cluster).work(plan)
    per_byte = 2 / GpuComputeModel(get_device(cluster.gpu)).kernel_params(plan.precision).bandwidth_Bps
    for st, params in zip(stages, params_by_rank, strict=True):
        want = per_byte * DTYPE_BYTES[plan.precision] * params if copies else 0.0
        assert st.gather_copy_s == pytest.approx(want, rel=1e-12)
        # The gradients' copy into the reduction's buffer: bf16 read, fp32 written.
        want = per_byte * (DTYPE_BYTES[plan.precision] + GRAD_BYTES[plan.precision]) / 2 * params if copies else 0.0
        assert st.reduce_copy_s == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("pp", [1, 2])
def test_a_step_copies_once_where_the_weights_stay_gathered(pp: int) -> None:
    """Without re-gathers FSDP2 gathers (and copies out) each stage's weights once per step, in its
    first forward (they are resharded after the last backward), and copies the gradients into the
    reduction's buffer once, after the rank's last backward (torch's pipelining runtime runs
    FSDP2's post-backward in ``perform_reduce_grad``, once the input gradient is sent on): every
    action but the first forward lasts as long as under Megatron's in-place buffers (ZeRO-0:
    nothing gathered over the network either way)."""
    model = Model(kind="gpt", num_layers=4, hidden_size=512, num_heads=8, seq_len=256, vocab_size=1024)
    cluster = Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=2 * pp)
    plan = Plan(dp=2, pp=pp, micro_batch_size=2, global_batch_size=16)
    (fsdp, megatron) = (simulate(model, cluster, dataclasses.replace(plan, dp_impl=impl),
                                 SimulationOptions(timeline=True)) for impl in ("fsdp2", "megatron"))
    stages = Simulator(model, cluster).work(plan)[2]

    def actions(r: Any) -> list[tuple[str, str, float]]:
        return [(e.category, e.name, e.end_s - e.start_s) for e in r.timeline
                if e.thread == "compute" and e.category in ("F", "B") and e.rank == 0]

    mine, theirs = actions(fsdp), actions(megatron)
    assert [a[:2] for a in mine] == [a[:2] for a in theirs] and len(mine) == 2 * plan.num_microbatches
    extra = [a[2] - b[2] for a, b in zip(mine, theirs, strict=True)]
    first_f = next(i for i, a in enumerate(mine) if a[0] == "F")
    assert extra[first_f] == pytest.approx(stages[0].gather_copy_s, rel=1e-9) and stages[0].gather_copy_s > 0
    assert all(abs(x) < 1e-12 for i, x in enumerate(extra) if i != first_f)
    (copy,) = [e for e in fsdp.timeline if e.rank == 0 and e.category == "copy"]
    assert copy.thread == "compute" and stages[0].reduce_copy_s > 0
    assert copy.end_s - copy.start_s == pytest.approx(stages[0].reduce_copy_s, rel=1e-9)
    last = max(e.end_s for e in fsdp.timeline if e.rank == 0 and e.category == "B")
    assert copy.start_s >= last - 1e-12
    assert not [e for e in megatron.timeline if e.category == "copy"]
    assert fsdp.iteration_time_s > megatron.iteration_time_s


@pytest.mark.parametrize(("zero", "pp"), [(1, 2), (2, 2), (1, 1), (2, 1)])
def test_zero12_gathers_before_the_first_forward_under_fsdp2(zero: int, pp: int) -> None:
    """The executor runs ZeRO-1/2 as ``fully_shard``, resharded after the step's last backward: the
    step's first forward gathers each module (the first before it, the rest prefetched under it),
    as ZeRO-3 under pipelining. Megatron's distributed optimizer gathers after the optimizer step."""
    model = Model(kind="gpt", num_layers=4, hidden_size=512, num_heads=8, seq_len=256, vocab_size=1024)
    cluster = Cluster(gpu="a100-sxm4-80gb", num_nodes=1, gpus_per_node=2 * pp)
    plan = Plan(dp=2, pp=pp, micro_batch_size=2, global_batch_size=16, zero_stage=zero)
    for impl in ("fsdp2", "megatron"):
        p = dataclasses.replace(plan, dp_impl=impl)
        assert gathers_before_forward(p) == (impl == "fsdp2")
        r = simulate(model, cluster, p, SimulationOptions(timeline=True))
        tl = [e for e in r.timeline if e.rank == 0]
        first_f = min(e.start_s for e in tl if e.category == "F")
        last_b = max(e.end_s for e in tl if e.category == "B")
        before = [e for e in tl if e.name.startswith("param-gather stage") and e.start_s <= first_f + 1e-12]
        after = [e for e in tl if e.name.startswith("param-gather bucket")]
        if impl == "fsdp2":
            assert before and not after
        else:
            assert not before and after and all(e.start_s >= last_b - 1e-12 for e in after)
