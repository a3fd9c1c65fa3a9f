"""Per-rank memory model: Korthikanti et al.'s closed forms, in-flight weighting, ZeRO states,
the torch model's real saved bytes, and monotonicity properties."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mindpipe.simulator.actions import Action, Schedule, loop_stage_to_rank
from mindpipe.simulator.activations import final_norm_grad_bytes, weight_pass_grad_bytes
from mindpipe.simulator.costs import layer_params
from mindpipe.simulator.memory import (
    GIB,
    GPU_RESERVED_BYTES,
    StageMemoryModel,
    activation_bytes_per_layer,
    embedding_activation_bytes,
    fits_in_memory,
    head_activation_bytes,
    head_logit_bytes,
    loss_transient_bytes,
    model_state_bytes,
    peak_memory_gib,
    plan_memory,
    stage_memory,
)
from mindpipe.simulator.schedules import build_schedule
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import LAYER_POLICY

A100 = get_device("a100-sxm4-80gb")
CPU = get_device("cpu")

# Korthikanti et al. Table 3 shapes (s = 2048, t = 8, GPT-3 dropout 0.1); V = 51200.
PAPER = {
    "22b": dict(num_layers=48, hidden_size=6144, num_heads=64),
    "175b": dict(num_layers=96, hidden_size=12288, num_heads=96),
    "530b": dict(num_layers=105, hidden_size=20480, num_heads=128),
    "1t": dict(num_layers=128, hidden_size=25600, num_heads=160),
}


def paper_model(name: str, **kw) -> Model:
    return Model(kind="gpt", seq_len=2048, vocab_size=51200, dropout=0.1, **{**PAPER[name], **kw})


def sbh(model: Model, b: int) -> Fraction:
    return Fraction(model.seq_len * b * model.hidden_size)


def attn(model: Model) -> Fraction:
    """a·s/h, the attention-score term's coefficient."""
    return Fraction(model.num_heads * model.seq_len, model.hidden_size)


@pytest.mark.parametrize("name", sorted(PAPER))
@pytest.mark.parametrize("b", [1, 4])
@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_table2_exact(name, b, t):
    """Table 2 of Korthikanti et al. (2-byte activations, 1-byte masks), to the byte."""
    m = paper_model(name)
    x, r = sbh(m, b), attn(m)

    def ours(recompute: str, sp: bool, policy: str | None = None) -> float:
        plan = Plan(tp=t, micro_batch_size=b, global_batch_size=b, recompute=recompute, sequence_parallel=sp)
        return activation_bytes_per_layer(m, plan, policy=policy)

    assert ours("none", False) == x * (10 + Fraction(24, t) + 5 * r / t)
    assert ours("selective", False) == x * (10 + Fraction(24, t))
    assert ours("full", False) == 2 * x
    if t == 1:
        assert ours("none", False) == x * (34 + 5 * r)  # Eq. 1, no parallelism
        return
    assert ours("none", True) == x / t * (34 + 5 * r)
    assert ours("selective", True) == 34 * x / t
    assert ours("full", True) == 2 * x / t
    # vPipe's per-layer policies (traces.layout): keep = everything kept, whatever the plan's level;
    # recompute = full; swap = nothing on device.
    assert ours("selective", True, LAYER_POLICY["keep"]) == x / t * (34 + 5 * r)
    assert ours("full", True, LAYER_POLICY["keep"]) == x / t * (34 + 5 * r)
    assert ours("none", True, LAYER_POLICY["recompute"]) == 2 * x / t
    assert ours("none", True, LAYER_POLICY["swap"]) == 0


def test_headline_five_fold_reduction():
    """The paper's abstract: sequence parallelism + selective recompute cut activations ~5×
    against tensor parallelism alone (t = 8); for 530B and 1T exactly 21/4.25."""
    for name in ("530b", "1t"):
        m = paper_model(name)
        base = activation_bytes_per_layer(m, Plan(tp=8))
        both = activation_bytes_per_layer(m, Plan(tp=8, sequence_parallel=True, recompute="selective"))
        assert base / both == pytest.approx(21 / 4.25, rel=1e-12)


def test_ffn_width_scales_the_mlp_terms_as_megatron():
    """Megatron's theoretical_memory_usage: s·b·h·(18 + 4·ffn/h)/t with SP + selective."""
    for ffn in (8192, 16384, 28672):
        m = paper_model("175b", ffn_hidden_size=ffn)
        plan = Plan(tp=8, sequence_parallel=True, recompute="selective")
        assert activation_bytes_per_layer(m, plan) == sbh(m, 1) * (18 + Fraction(4 * ffn, m.hidden_size)) / 8


def test_fp32_and_no_dropout_accounting():
    m = paper_model("175b")
    x, r = sbh(m, 1), attn(m)
    # fp32: 4-byte activations, masks stay 1 byte on a GPU: 16·4 + 2 = 66 per sbh, 2·4 + 1 = 9 per a·s²·b.
    assert activation_bytes_per_layer(m, Plan(precision="fp32")) == x * (66 + 9 * r)
    # No dropout: no masks, and attention keeps only the softmax output (2 B).
    m0 = dataclasses.replace(m, dropout=0.0)
    assert activation_bytes_per_layer(m0, Plan()) == x * (32 + 2 * r)
    assert activation_bytes_per_layer(m0, Plan(tp=4)) == x * (8 + Fraction(24, 4) + 2 * r / 4)
    # CPU masks are activation-sized.
    assert activation_bytes_per_layer(m, Plan(precision="fp32"), mask_bytes=4) == x * (72 + 12 * r)
    with pytest.raises(ContractError, match="layer_memory_policy"):
        activation_bytes_per_layer(m, Plan(), policy="offload")


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_relation_to_the_torch_model(dropout):
    """traces.torch_gpt.block_activation_bytes is what our torch block saves at fp32 on CPU
    (masks dtype-sized); it equals ours with CPU masks plus the LayerNorm statistics
    (2 LayerNorms × mean and rstd × 4 B × s·b) that Korthikanti et al. leave out."""
    torch_gpt = pytest.importorskip("mindpipe.traces.torch_gpt")
    for h, a, s, b, ffn in [(64, 4, 32, 3, None), (96, 8, 16, 2, 160), (12288, 96, 2048, 1, None)]:
        m = Model(kind="gpt", num_layers=1, hidden_size=h, num_heads=a, seq_len=s, vocab_size=50, dropout=dropout,
                  ffn_hidden_size=ffn)
        plan = Plan(micro_batch_size=b, global_batch_size=b, precision="fp32")
        mask = torch_gpt.dropout_mask_bytes("cpu", 4) if dropout else None
        expected = torch_gpt.block_activation_bytes(m, b, s, 4, mask)
        assert activation_bytes_per_layer(m, plan, mask_bytes=4) + 2 * 2 * 4 * s * b == expected


def test_relation_measured_on_the_torch_block():
    """The same relation against bytes autograd really saves for one tiny block (CPU, fp32)."""
    torch = pytest.importorskip("torch")
    from mindpipe.traces.timing import saved_activation_bytes
    from mindpipe.traces.torch_gpt import build_gpt

    m = Model(kind="gpt", num_layers=1, hidden_size=32, num_heads=4, seq_len=16, vocab_size=50, dropout=0.1)
    net = build_gpt(m).train()
    x = torch.randn(2, 16, 32, requires_grad=True)
    measured, _ = saved_activation_bytes(lambda: net.blocks["0"](x), list(net.parameters()) + list(net.buffers()))
    plan = Plan(micro_batch_size=2, global_batch_size=2, precision="fp32")
    assert measured == activation_bytes_per_layer(m, plan, mask_bytes=4) + 2 * 2 * 4 * 16 * 2


def _acts(model: Model, plan: Plan, schedule: Schedule, layers: list[int], device=A100) -> list[float]:
    return [rm.activations_bytes for rm in stage_memory(model, plan, device, schedule, layers)]


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_first_stage_holds_all_layers_in_1f1b(p):
    """Korthikanti §4.3: the first 1F1B stage holds p micro-batches × L/p layers = L × per-layer for any p,
    plus p micro-batches of embedding extras; equal to Megatron's compute_activation_memory (SP +
    selective) except that token ids are not divided by t (every TP rank holds them)."""
    m = paper_model("175b")
    t, s, b, h = 8, m.seq_len, 1, m.hidden_size
    plan = Plan(tp=t, pp=p, global_batch_size=64, recompute="selective", sequence_parallel=True)
    layers = [m.num_layers // p] * p
    acts = _acts(m, plan, build_schedule("1f1b", p, 64), layers)
    per_layer = activation_bytes_per_layer(m, plan)
    assert acts[0] == m.num_layers * per_layer + p * embedding_activation_bytes(m, plan)
    megatron = (s * b * h * (18 + 4 * m.ffn / h) * m.num_layers + 8 * s * b * p + s * b * h * p) / t
    assert acts[0] == pytest.approx(megatron + 8 * s * b * p * (1 - 1 / t), rel=1e-12)
    # The last stage holds one micro-batch of its blocks and of the head (logits in fp32).
    assert acts[-1] == m.num_layers // p * per_layer + head_activation_bytes(m, plan)
    assert head_activation_bytes(m, plan) == 4 * s * b * h / t * (1 + Fraction(m.vocab_size, h))


def test_hand_built_1f1b_and_gpipe_in_flight():
    """1F1B: stage s of p holds p − s micro-batches; GPipe: all m (orders written by hand). The
    sequence is long enough that a micro-batch's activations outweigh the stage's gradients, so the
    peak is where the most micro-batches are held, gradients or not."""
    m = Model(kind="gpt", num_layers=6, hidden_size=64, num_heads=4, seq_len=512, vocab_size=128)
    plan = Plan(pp=3, global_batch_size=4)
    per = activation_bytes_per_layer(m, plan)
    emb, head = embedding_activation_bytes(m, plan), head_activation_bytes(m, plan)
    one_f_one_b = [
        "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3",
        "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3",
        "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3",
    ]
    sched = Schedule("1f1b", 3, 4, 3, loop_stage_to_rank(3, 3), [[Action.parse(a) for a in o.split()] for o in one_f_one_b])
    assert _acts(m, plan, sched, [2, 2, 2]) == [3 * (2 * per + emb), 2 * 2 * per, 1 * (2 * per + head)]
    # Unequal partition: weights follow the layers.
    assert _acts(m, plan, sched, [1, 2, 3]) == [3 * (per + emb), 2 * 2 * per, 3 * per + head]
    gpipe = ["0F0 0F1 0F2 0B0 0B1 0B2", "1F0 1F1 1F2 1B0 1B1 1B2"]
    gsched = Schedule("gpipe", 2, 3, 2, [0, 1], [[Action.parse(a) for a in o.split()] for o in gpipe])
    plan2 = Plan(pp=2, global_batch_size=3, schedule="gpipe")
    assert _acts(m, plan2, gsched, [3, 3]) == [3 * (3 * per + emb), 3 * (3 * per + head)]


@pytest.mark.parametrize(("p", "m_"), [(4, 2), (4, 8), (3, 7)])
def test_built_schedules_in_flight(p, m_):
    model = Model(kind="gpt", num_layers=2 * p, hidden_size=64, num_heads=4, seq_len=512, vocab_size=128)
    plan = Plan(pp=p, global_batch_size=m_)
    per = activation_bytes_per_layer(model, plan)
    one = _acts(model, plan, build_schedule("1f1b", p, m_), [2] * p)
    for r in range(1, p - 1):  # middle stages carry no embedding/head extras
        assert one[r] == min(p - r, m_) * 2 * per
    # ZB-H1: Qi et al. (§3) count 1F1B's memory, as if I freed the activations. torch's I keeps the
    # graph for W (retain_graph), so each stage holds its blocks until W, and the W's deferred by
    # p − 1 − r slots keep min(p, m) micro-batches on every rank; on the last stage only the one
    # micro-batch between its F and its I still holds the loss's fp32 log-softmax (I frees it), and
    # from I to W each holds the logits' gradient the LM head's W needs instead (bf16: half as large).
    # (Changed in issue 16: measured memory of the zb_h1 last stage was ~15-20 % above the old count.)
    zb_plan = dataclasses.replace(plan, schedule="zb_h1")
    zb = _acts(model, zb_plan, build_schedule("zb_h1", p, m_), [2] * p)
    k = min(p, m_)
    emb, head = embedding_activation_bytes(model, zb_plan), head_activation_bytes(model, zb_plan)
    assert zb[0] == one[0] == k * (2 * per + emb)
    # From I to W each micro-batch also holds its blocks' output gradients, one per parameter group
    # (torch's stage_backward_input keeps them for W: weight_pass_grad_bytes); on rank r the W's of
    # up to r micro-batches are pending at the peak (the first stage's I does nothing: none).
    held = 2 * weight_pass_grad_bytes(model, zb_plan)
    # The rank's last I before the peak, its own in its transient, ties with the W after it, which
    # holds it among the activations: the tie goes to the point with more activations (RankMemory).
    assert all(zb[r] == k * 2 * per + min(r + 1, m_) * held for r in range(1, p - 1))
    grad = 2 * model.seq_len * model.vocab_size
    last = k * (2 * per + head) - (k - 1) * (head_logit_bytes(model, zb_plan) - grad)
    held += final_norm_grad_bytes(model, zb_plan)
    assert zb[-1] == last + (k - 1) * held
    assert head_logit_bytes(model, zb_plan) == 4 * model.seq_len * model.vocab_size  # fp32, micro-batch 1
    gp = _acts(model, dataclasses.replace(plan, schedule="gpipe"), build_schedule("gpipe", p, m_), [2] * p)
    assert all(gp[r] == m_ * 2 * per for r in range(1, p - 1))


@pytest.mark.parametrize(("p", "v"), [(4, 2), (4, 3), (8, 2)])
def test_interleaved_matches_megatron_warmup(p, v):
    """Rank r holds its warm-up count (p − r − 1)·2 + (v − 1)·p plus one chunk; for the first rank
    this is L·(1 + (p − 1)/(p·v)) layers, Megatron's interleaved memory penalty."""
    m_ = 2 * p
    model = Model(kind="gpt", num_layers=p * v * 2, hidden_size=64, num_heads=4, seq_len=32, vocab_size=128)
    plan = Plan(pp=p, virtual_stages=v, schedule="interleaved_1f1b", global_batch_size=m_)
    per = activation_bytes_per_layer(model, plan)
    acts = _acts(model, plan, build_schedule("interleaved_1f1b", p, m_, v), [2] * (p * v))
    for r in range(1, p):
        chunks = min((p - r - 1) * 2 + (v - 1) * p + 1, m_ * v)
        if r < p - 1:  # no embedding or head extras on middle ranks
            assert acts[r] == 2 * per * chunks
    penalty = model.num_layers * per * (1 + Fraction(p - 1, p * v))
    emb = embedding_activation_bytes(model, plan)
    # Rank 0's embedding extras ride on chunk 0: at least its 2p − 1 warm-up copies, at most one per chunk held.
    assert penalty + (2 * p - 1) * emb <= acts[0] <= penalty + (p * v + p - 1) * emb


def test_layer_memory_policy_and_transients():
    model = Model(kind="gpt", num_layers=4, hidden_size=64, num_heads=4, seq_len=512, vocab_size=128, dropout=0.1)
    base = Plan(pp=2, global_batch_size=2)
    plan = dataclasses.replace(base, layer_memory_policy=["keep", "recompute", "swap", "keep"])
    none = activation_bytes_per_layer(model, base)
    full = activation_bytes_per_layer(model, base, policy="full")
    emb, head = embedding_activation_bytes(model, base), head_activation_bytes(model, base)
    mem = stage_memory(model, plan, A100, build_schedule("1f1b", 2, 2), [2, 2], reserved_bytes=0)
    assert [rm.activations_bytes for rm in mem] == [2 * (none + full + emb), none + head]
    # A recomputed block comes back whole, a swapped one tensor by tensor (its largest: here the
    # softmax output, 2·a·s²·b), less what the backward already freed: on stage 1 the swapped block 2
    # comes back after block 3 (kept, ``none``) and the head released theirs, so it adds nothing;
    # the loss's own backward temporaries (two fp32 logits-sized gradients) are stage 1's transient.
    loss = loss_transient_bytes(model, base)
    assert loss == 2 * 4 * 512 * 1 * 128
    # (A recomputed block re-saves all but its input, which the block holds: ``none − full``.)
    assert [rm.other_bytes for rm in mem] == [none - full, loss]
    late = dataclasses.replace(base, layer_memory_policy=["keep", "recompute", "keep", "keep"])
    mem = stage_memory(model, late, A100, build_schedule("1f1b", 2, 2), [2, 2], reserved_bytes=0)
    assert [rm.other_bytes for rm in mem] == [none - full, loss]
    # Stage 0's backwards follow another action (1F1B: F0 F1 B0 B1), so its swapped block is
    # prefetched: it comes back whole (``none``) while F1 runs for B0, and again while B0 runs for B1:
    # B0 holds its own copies until it ends, so two micro-batches' are back at once.
    swap_last = dataclasses.replace(base, layer_memory_policy=["keep", "swap", "keep", "keep"])
    assert build_schedule("1f1b", 2, 2).prefetched_sets(0) == 2
    mem = stage_memory(model, swap_last, A100, build_schedule("1f1b", 2, 2), [2, 2], reserved_bytes=0)
    assert [rm.other_bytes for rm in mem] == [2 * none, loss]
    # With one micro-batch each backward follows its own forward: nothing is prefetched, and the
    # swapped block comes back tensor by tensor (its largest: the softmax output, d·a·s²·b > d·s·b·4h).
    one = dataclasses.replace(swap_last, global_batch_size=1)
    mem = stage_memory(model, one, A100, build_schedule("1f1b", 2, 1), [2, 2], reserved_bytes=0)
    assert [rm.other_bytes for rm in mem] == [2 * 4 * 512 * 512 * 1, loss]
    kept = stage_memory(model, base, A100, build_schedule("1f1b", 2, 2), [2, 2], reserved_bytes=0)
    assert [rm.other_bytes for rm in kept] == [0.0, loss]
    with pytest.raises(ContractError, match="layer_memory_policy"):
        stage_memory(model, dataclasses.replace(base, layer_memory_policy=["keep"]), A100,
                     build_schedule("1f1b", 2, 2), [2, 2])


def test_zero_stages_and_precisions():
    P = 1_000_000
    # ZeRO-3 without pipelining (FSDP2 frees gathered weights after each forward): at rest the bf16
    # copy does not exist, the fp32 master shard (in the 12/dp) is the parameter.
    for z, expect in [(0, (2, 4, 12)), (1, (2, 4, 3)), (2, (2, 1, 3)), (3, (0, 1, 3))]:
        plan = Plan(dp=4, global_batch_size=4, zero_stage=z)
        assert model_state_bytes(P, plan) == tuple(e * P for e in expect)
    # Megatron: 18 B/param, 6 + 12/d with the distributed optimizer (= ZeRO-1).
    assert sum(model_state_bytes(P, Plan(dp=8, global_batch_size=8))) == 18 * P
    assert sum(model_state_bytes(P, Plan(dp=8, global_batch_size=8, zero_stage=1))) == (6 + 12 / 8) * P
    # ZeRO paper (fp16): 16 B/param; fp32 Adam: 4 + 4 + 8.
    assert sum(model_state_bytes(P, Plan(precision="fp16"))) == 16 * P
    assert model_state_bytes(P, Plan(precision="fp32")) == (4 * P, 4 * P, 8 * P)


def test_rank_states_cover_the_model_and_zero3_gathers():
    model = Model(kind="gpt", num_layers=4, hidden_size=64, num_heads=4, seq_len=32, vocab_size=128)
    plan = Plan(pp=2, global_batch_size=2, precision="fp32")
    mem = stage_memory(model, plan, A100, build_schedule("1f1b", 2, 2), [2, 2])
    assert sum(rm.weights_bytes for rm in mem) == 4 * model.param_count()
    assert [rm.other_bytes for rm in mem] == [GPU_RESERVED_BYTES, GPU_RESERVED_BYTES + loss_transient_bytes(model, plan)]
    # Under pipelining FSDP2 keeps ZeRO-3's gathered weights for the step: the whole copy and the
    # fp32 shard beside it; no per-layer gathers on top.
    z3 = dataclasses.replace(plan, dp=2, global_batch_size=4, zero_stage=3)
    mem3 = stage_memory(model, z3, A100, build_schedule("1f1b", 2, 2), [2, 2], reserved_bytes=0)
    assert [rm.weights_bytes for rm in mem3] == [1.5 * rm.weights_bytes for rm in mem]
    assert [rm.other_bytes for rm in mem3] == [0.0, loss_transient_bytes(model, z3)]
    # Without pipelining it frees them after each forward: the shard, and two layers gathered.
    flat = Plan(dp=2, global_batch_size=4, zero_stage=3, precision="fp32")
    one = stage_memory(model, flat, A100, build_schedule("1f1b", 1, 2), [4], reserved_bytes=0)[0]
    assert one.weights_bytes == 4 * model.param_count() / 2
    sizes = {k: n for _, k, n in layer_params(model, 1)}
    # The layer being computed and the prefetched one are gathered whole (largest layer of the rank).
    assert sizes["block"] > sizes["embedding"] > sizes["lm_head"]
    # ... while a block runs, not at the loss (FSDP2 frees the stage's gathers when its forward ends)
    assert one.other_bytes == max(2 * 4 * sizes["block"], loss_transient_bytes(model, flat))
    wide = dataclasses.replace(model, vocab_size=4096)
    sizes = {k: n for _, k, n in layer_params(wide, 1)}
    one = stage_memory(wide, flat, A100, build_schedule("1f1b", 1, 2), [4], reserved_bytes=0)[0]
    assert one.other_bytes == max(2 * 4 * sizes["embedding"], loss_transient_bytes(wide, flat))
    # A recomputed block's re-run happens with its weights gathered again: the two add up.
    redo = dataclasses.replace(flat, recompute="full")
    layer_sizes = {k: n for _, k, n in layer_params(model, 1)}
    mm = StageMemoryModel(model, redo, A100, 0, None)
    back = mm.redone_bytes(["full"] * 4, ["whole"] * 4, head_activation_bytes(model, redo))
    one = stage_memory(model, redo, A100, build_schedule("1f1b", 1, 2), [4], reserved_bytes=0)[0]
    assert back > 0 and one.other_bytes == max(2 * 4 * layer_sizes["block"] + back,
                                               loss_transient_bytes(model, redo))


def test_fsdp_keeps_gathered_weights_and_whole_gradients():
    """ZeRO-0/1/2 under FSDP2: the gathered weights stay for the step beside their shards (a copy of
    its own in fp32, the master copy under mixed precision); ZeRO-2/3 accumulate whole gradients
    over a step's micro-batches and reduce-scatter after the last."""
    P = 1_000_000
    z1 = Plan(dp=2, global_batch_size=4, zero_stage=1, precision="fp32")
    assert model_state_bytes(P, z1) == (4 * P + 4 * P / 2, 4 * P, 8 * P / 2)
    assert model_state_bytes(P, dataclasses.replace(z1, precision="bf16")) == (2 * P, 4 * P, 12 * P / 2)
    z2 = dataclasses.replace(z1, zero_stage=2, pp=2, global_batch_size=8)
    assert model_state_bytes(P, z2)[1] == 4 * P  # pipelined, two micro-batches: whole gradients
    assert model_state_bytes(P, dataclasses.replace(z2, global_batch_size=2))[1] == 4 * P / 2
    # Without pipelining every micro-batch is reduce-scattered (FSDP2's default): the shard only.
    assert model_state_bytes(P, dataclasses.replace(z1, zero_stage=2))[1] == 4 * P / 2
    assert model_state_bytes(P, dataclasses.replace(z1, dp=1, global_batch_size=2)) == (4 * P, 4 * P, 8 * P)
    # ZeRO-0 is FSDP2's replicate: its gathered copy is a buffer of its own beside the whole replica
    # (twice the weights in fp32; under bf16 the replica is the master copy in the optimizer's bytes).
    z0 = dataclasses.replace(z1, zero_stage=0)
    assert model_state_bytes(P, z0) == (4 * P + 4 * P, 4 * P, 8 * P)
    assert model_state_bytes(P, dataclasses.replace(z0, precision="bf16")) == (2 * P, 4 * P, 12 * P)
    assert model_state_bytes(P, dataclasses.replace(z0, dp=1, global_batch_size=2)) == (4 * P, 4 * P, 8 * P)
    # Megatron-LM's DDP and distributed optimizer gather into the parameters' own buffer: one copy
    # of the weights in fp32, the same totals as FSDP2 under mixed precision; ZeRO-3 gathers apart.
    for fsdp in (z0, z1, dataclasses.replace(z1, zero_stage=2)):
        mega = dataclasses.replace(fsdp, dp_impl="megatron")
        assert model_state_bytes(P, mega)[0] == 4 * P
        assert model_state_bytes(P, mega)[1:] == model_state_bytes(P, fsdp)[1:]
        bf16 = dataclasses.replace(fsdp, precision="bf16")
        assert model_state_bytes(P, dataclasses.replace(bf16, dp_impl="megatron")) == model_state_bytes(P, bf16)
    z3 = dataclasses.replace(z1, zero_stage=3, pp=2, global_batch_size=8)
    assert model_state_bytes(P, dataclasses.replace(z3, dp_impl="megatron")) == model_state_bytes(P, z3)


def test_cpu_device_masks_and_reserve():
    """On a CPU the torch model keeps dtype-sized masks and no framework reserve."""
    model = Model(kind="gpt", num_layers=2, hidden_size=64, num_heads=4, seq_len=512, vocab_size=128, dropout=0.1)
    plan = Plan(global_batch_size=1, precision="fp32")
    (rm,) = stage_memory(model, plan, CPU, build_schedule("1f1b", 1, 1), [2])
    assert rm.other_bytes == loss_transient_bytes(model, plan)  # the loss's backward; no framework reserve
    assert rm.activations_bytes == (2 * activation_bytes_per_layer(model, plan, mask_bytes=4)
                                    + embedding_activation_bytes(model, plan, mask_bytes=4)
                                    + head_activation_bytes(model, plan))
    assert rm.capacity_bytes == CPU.memory_capacity_bytes


def test_fits_peak_and_gib():
    m = paper_model("175b")
    single = Plan(global_batch_size=1)
    assert not fits_in_memory(m, single, A100)
    plan = Plan(dp=8, tp=8, pp=8, global_batch_size=512, recompute="selective", sequence_parallel=True, zero_stage=1)
    mem = plan_memory(m, plan, A100)
    assert fits_in_memory(m, plan, A100) and all(rm.fits for rm in mem)
    assert peak_memory_gib(m, plan, A100) == max(rm.total_bytes for rm in mem) / GIB == mem[0].total_gib
    g = mem[0].gib()
    assert g["total_gib"] == pytest.approx(sum(g[k] for k in g if k not in ("total_gib", "capacity_gib")))
    assert g["capacity_gib"] == 80
    assert not fits_in_memory(m, plan, A100, reserved_bytes=80 * GIB)


def test_mismatched_inputs_are_contract_errors():
    model = Model(kind="gpt", num_layers=4, hidden_size=64, num_heads=4, seq_len=32, vocab_size=128)
    plan = Plan(pp=2, global_batch_size=2)
    sched = build_schedule("1f1b", 2, 2)
    for layers in ([4], [2, 1], [3, 2]):
        with pytest.raises(ContractError, match="partition"):
            stage_memory(model, plan, A100, sched, layers)
    with pytest.raises(ContractError, match="pp"):
        stage_memory(model, plan, A100, build_schedule("1f1b", 4, 4), [1, 1, 1, 1])


@st.composite
def _cases(draw):
    heads = draw(st.sampled_from([4, 8]))
    model = Model(kind="gpt", num_layers=draw(st.integers(2, 6)), hidden_size=heads * draw(st.sampled_from([8, 16])),
                  num_heads=heads, seq_len=draw(st.sampled_from([16, 64])), vocab_size=draw(st.integers(64, 300)),
                  dropout=draw(st.sampled_from([0.0, 0.1])))
    pp = draw(st.integers(1, 2))
    fields = dict(pp=pp, dp=draw(st.sampled_from([1, 2])), recompute=draw(st.sampled_from(["none", "selective", "full"])),
                  precision=draw(st.sampled_from(["fp32", "bf16"])), zero_stage=draw(st.integers(0, 3)),
                  schedule=draw(st.sampled_from(["1f1b", "gpipe", "zb_h1"])))
    return model, fields, draw(st.integers(2, 3))


def _totals(model: Model, m_: int, b: int, **fields) -> list[float]:
    plan = Plan(micro_batch_size=b, global_batch_size=b * m_ * fields["dp"], **fields)
    return [rm.total_bytes for rm in plan_memory(model, plan, A100)]


@settings(max_examples=40, deadline=None)
@given(_cases(), st.integers(1, 4))
def test_memory_grows_with_micro_batch(case, b):
    model, fields, m_ = case
    small, big = _totals(model, m_, b, **fields), _totals(model, m_, b + 1, **fields)
    assert all(x < y for x, y in zip(small, big, strict=True))


@settings(max_examples=40, deadline=None)
@given(_cases(), st.booleans())
def test_memory_falls_with_tensor_parallelism(case, sp):
    model, fields, m_ = case
    series = [_totals(model, m_, 1, tp=t, sequence_parallel=sp and t > 1, **fields) for t in (1, 2, 4)]
    for lo, hi in zip(series[1:], series[:-1], strict=True):
        assert all(x < y for x, y in zip(lo, hi, strict=True))


@pytest.mark.parametrize(("dropout", "kind", "per_sbh"), [
    (0.0, "gpt", 18),    # input 2, QKV 6, projection output 2, fc1 output 8 (d = 2, f = 4h)
    (0.1, "gpt", 20),    # + fc2's output, which the MLP-dropout mask is re-drawn from; no mask kept
    (0.0, "llama", 2 + 2 + 2 * 2 * 0.25 + 2 + 2 * 2 * 2),  # input, Q, K and V at r = 1/4, proj, gate and up (f = 2h)
])
def test_nongemm_keeps_the_input_and_the_gemm_outputs(dropout, kind, per_sbh):
    """``nongemm`` (traces/layout.py) keeps the block input and its GEMM outputs, nothing s²-sized:
    between full recompute's 2·s·b·h and selective's, whatever the attention term."""
    extra = {"num_kv_heads": 4, "ffn_hidden_size": 2048} if kind == "llama" else {}
    model = Model(kind=kind, num_layers=2, hidden_size=1024, num_heads=16, seq_len=512, vocab_size=1000,
                  dropout=dropout, **extra)
    plan = Plan(micro_batch_size=2, global_batch_size=2, precision="bf16")
    got = activation_bytes_per_layer(model, plan, policy="nongemm")
    assert got == pytest.approx(per_sbh * sbh(model, 2))
    assert activation_bytes_per_layer(model, plan, policy="full") < got < activation_bytes_per_layer(
        model, plan, policy="selective")


def test_gradients_exist_from_the_first_backward():
    """torch allocates the weight gradients in the backward and frees them at the step, so the
    forwards before a stage's first backward hold their activations without them: a plan of one
    micro-batch peaks with no gradients (or at its gradients alone, after the backward), and so
    does 1F1B's first stage when m = p; with m > p its steady state holds p micro-batches with them."""
    model = Model(kind="gpt", num_layers=4, hidden_size=64, num_heads=4, seq_len=512, vocab_size=128)
    one = Plan(global_batch_size=1, precision="fp32")
    (rm,) = stage_memory(model, one, CPU, build_schedule("1f1b", 1, 1), [4])
    weights, grads, optim = model_state_bytes(sum(n for _, _, n in layer_params(model, 1)), one)
    acts = (4 * activation_bytes_per_layer(model, one, mask_bytes=4) + embedding_activation_bytes(model, one, mask_bytes=4)
            + head_activation_bytes(model, one))
    assert acts + loss_transient_bytes(model, one) > grads
    assert (rm.gradients_bytes, rm.activations_bytes, rm.other_bytes) == (0.0, acts, loss_transient_bytes(model, one))
    assert rm.total_bytes == weights + optim + acts + loss_transient_bytes(model, one)
    # A model whose gradients outweigh one micro-batch peaks after its backward, with nothing else held.
    tiny = dataclasses.replace(model, seq_len=8)
    (rm,) = stage_memory(tiny, one, CPU, build_schedule("1f1b", 1, 1), [4])
    w, g, o = model_state_bytes(sum(n for _, _, n in layer_params(tiny, 1)), one)
    assert (rm.activations_bytes, rm.other_bytes, rm.total_bytes) == (0.0, 0.0, w + g + o)
    # 1F1B, p = 2: the first stage holds 2 micro-batches before its first backward (no gradients) at
    # m = 2, and 2 with its gradients in the steady state at m = 4.
    for m_, with_grads in ((2, False), (4, True)):
        plan = Plan(pp=2, global_batch_size=m_)
        per = 2 * activation_bytes_per_layer(model, plan) + embedding_activation_bytes(model, plan)
        first = stage_memory(model, plan, A100, build_schedule("1f1b", 2, m_), [2, 2], reserved_bytes=0)[0]
        sizes = dict((name, n) for name, _, n in layer_params(model, 1))
        g0 = model_state_bytes(sizes["embedding"] + sizes["block.0"] + sizes["block.1"], plan)[1]
        assert first.activations_bytes == 2 * per
        assert first.gradients_bytes == (g0 if with_grads else 0.0)


def test_the_memory_table_shows_errors_under_a_tenth_of_a_percent():
    """The demo's table printed every row as "-0.0 %" where the errors were −0.01 to −0.09 %."""
    from mindpipe.simulator.calibrate.memory_fidelity import MemoryRow, memory_table_markdown

    row = MemoryRow(rank=0, pp_rank=0, stages=[0], predicted_bytes=9996.0, measured_bytes=10000, source="tensor_accounting")
    assert memory_table_markdown({"dp2": [row]}).splitlines()[-1].endswith("| -0.04 % |")


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_a_weight_pass_takes_torchs_groups_in_order_and_frees_what_it_kept(kind):
    """The split backward's W per parameter group (weight_pass_groups): one entry per group torch
    makes (weight_groups), what I keeps for it summing to 11·s·b·h·d per GPT block and
    (5 + 2r)·h + 2f per Llama token; a swapped block's W peaks at its first group (the norm's input,
    s·b·h·d: nothing freed yet), not at its largest tensor (the MLP's last GEMM input), which comes
    after the groups before it freed what they kept (gpt-mini-sized ZB-H1 pp4: +3 % on the rank when
    the model held them all beside the largest tensor)."""
    from mindpipe.simulator.activations import weight_pass_groups
    from mindpipe.traces.layout import weight_groups

    model = (Model(kind="llama", num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=2, ffn_hidden_size=192,
                   seq_len=32, vocab_size=128, name="l") if kind == "llama" else
             Model(kind="gpt", num_layers=4, hidden_size=64, num_heads=4, seq_len=32, vocab_size=128, name="g"))
    plan = Plan(pp=2, schedule="zb_h1", micro_batch_size=2, global_batch_size=4, precision="fp32",
                layer_memory_policy=["keep", "swap", "swap", "keep"])
    unit = 4 * model.seq_len * 2 * model.hidden_size
    for part in ("whole", "attention", "mlp"):
        assert len(weight_pass_groups(model, plan, part=part)) == weight_groups(model, part)
    groups = weight_pass_groups(model, plan)
    per_token = (5 + 2 * model.kv_heads / model.num_heads) + 2 * model.ffn / model.hidden_size if kind == "llama" else 11
    assert sum(kept for kept, _ in groups) == pytest.approx(per_token * unit)
    assert groups[-1][1] == model.ffn / model.hidden_size * unit  # the MLP's last GEMM's input, the largest
    mm = StageMemoryModel(model, plan, get_device("cpu"), None, None, split_backward=True)
    assert mm.weight_pass_walk(["swap"], ["whole"], {}) == unit
    # a kept block first: its groups free what they kept before the swapped block asks for anything
    assert mm.weight_pass_walk(["keep", "swap"], ["whole", "whole"], {}) == 0.0
    # a recomputed block re-runs in each of its groups' passes, less what those passes freed
    rerun = mm.rerun_bytes()
    walk = mm.weight_pass_walk(["full"], ["whole"], {"whole": rerun})
    freed = [sum(k for k, _ in groups[:i]) for i in range(len(groups))]
    assert walk == max((i + 1) * rerun - freed[i] for i in range(len(groups)))
    assert mm.stage(["swap"], False, False).transient("W", 0)[0] == unit


def test_a_merged_weight_pass_reruns_a_block_in_the_room_the_layers_above_it_freed():
    """One merged W pass walks the stage from its top, freeing each layer's saved tensors as it
    leaves it: a recomputed block under a kept one re-runs in the room that one freed (gpt-mini-8
    ZB-H1 pp4, W's peak measured at its start; +13.6 % on W when the re-run was added whole)."""
    from mindpipe.traces.layout import merged_weight_pass

    model = Model(kind="gpt", num_layers=4, hidden_size=64, num_heads=4, seq_len=32, vocab_size=128, name="g")
    plan = Plan(pp=2, schedule="zb_h1", micro_batch_size=2, global_batch_size=4, precision="fp32",
                layer_memory_policy=["keep", "keep", "recompute", "keep"])
    mm = StageMemoryModel(model, plan, get_device("cpu"), None, None, split_backward=True)
    rerun = mm.rerun_bytes()
    assert merged_weight_pass(model, ["full", "none"], ["whole", "whole"])
    assert mm.merged_pass_reruns(["full", "none"], ["whole", "whole"], {"whole": rerun}) == 0.0
    # two recomputed blocks under the head: the top one re-runs once the head's two inputs are freed
    above = 2 * 4 * model.seq_len * 2 * model.hidden_size
    assert mm.merged_pass_reruns(["full", "full"], ["whole", "whole"], {"whole": rerun}, above) == rerun - above
    assert mm.stage(["full", "full"], False, True).transient("W", 0)[0] == rerun - above
    # a kept block above them frees more than a re-run takes
    assert mm.merged_pass_reruns(["full", "full", "none"], ["whole"] * 3, {"whole": rerun}) == 0.0
    assert mm.stage(["full", "none"], False, False).transient("W", 0)[0] == 0.0


def test_a_split_backwards_input_pass_brings_swapped_tensors_back_beside_the_gradients_made_so_far():
    """Without a prefetch, I brings each swapped tensor back as its operator asks, from the block's
    top down, while it makes the gradients it keeps for W group by group (input_pass_steps): a GPT
    block's I peaks at its first norm (all eleven s·b·h of kept gradients and the norm's input), not
    at its largest tensor beside all of them (llama-tiny ZB-V, a swapped attention part: +5.7 % on
    its I before, +1.4 % now)."""
    from mindpipe.simulator.activations import input_pass_steps, weight_pass_groups

    model = Model(kind="gpt", num_layers=4, hidden_size=64, num_heads=4, seq_len=32, vocab_size=128, name="g")
    plan = Plan(pp=2, schedule="zb_h1", micro_batch_size=2, global_batch_size=4, precision="fp32",
                layer_memory_policy=["keep", "keep", "swap", "swap"], swap_copy_back=["lazy", "lazy"])
    mm = StageMemoryModel(model, plan, get_device("cpu"), None, None, split_backward=True)
    unit = 4 * model.seq_len * 2 * model.hidden_size
    core = mm.core_saved_bytes()
    assert core == 4 * 2 * model.num_heads * model.seq_len ** 2 == 2 * unit  # the softmax output
    for part in ("whole", "attention", "mlp"):
        steps = input_pass_steps(model, plan, mm.core_saved_bytes(part), part=part)
        assert sum(k for k, _ in steps) == sum(k for k, _ in weight_pass_groups(model, plan, part=part))
    # fc2 (kept 1, asks 4), GeLU (0, 4), fc1 (4, 1), ln2 (1, 1), proj (1, 1), core (0, 2), qkv (3, 1), ln1 (1, 1)
    assert mm.input_pass_walk(["swap"], ["whole"]) == 12 * unit
    assert mm.input_pass_walk(["none"], ["whole"]) == 11 * unit  # kept only: every gradient at I's end
    # a kept block above made its eleven first
    assert mm.input_pass_walk(["swap", "none"], ["whole", "whole"]) == 23 * unit
    # the stage's I without a prefetch: the walk, not the largest tensor beside every kept gradient
    assert mm.stage(["swap", "swap"], False, False, prefetch=0).transient("I", 0)[0] == 23 * unit
