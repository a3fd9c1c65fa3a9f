"""Swap to a host pool and live-tensor memory accounting, in one process (no launch).

The accounting must count what the simulator's memory model prices: per block and micro-batch,
``activation_bytes_per_layer`` under the block's policy (CPU masks), the embedding and head
extras, and one whole block while a recomputed or swapped block is back for its backward.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from mindpipe.executor.memory_account import MemoryAccount
from mindpipe.executor.offload import HostPool, host_buffer
from mindpipe.executor.parallelize import apply_recompute
from mindpipe.executor.stages import build_stage_modules
from mindpipe.simulator.activations import final_norm_grad_bytes, weight_pass_grad_bytes
from mindpipe.simulator.memory import activation_bytes_per_layer, embedding_activation_bytes, head_activation_bytes
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.layout import block_policies
from mindpipe.traces.torch_gpt import build_gpt, lm_loss

MODEL = Model(kind="gpt", num_layers=4, hidden_size=64, num_heads=4, seq_len=32, vocab_size=128)
CPU = torch.device("cpu")


def _stage(policies: list[str], budget: int | None = None) -> tuple[torch.nn.Module, MemoryAccount, HostPool, Plan]:
    plan = Plan(micro_batch_size=2, global_batch_size=2, precision="fp32", layer_memory_policy=policies)
    mod = build_stage_modules(build_gpt(MODEL, seed=0), plan, 0)[0]
    memory, pool = MemoryAccount([mod], CPU, "pipeline rank 0 (stages [0])", budget), HostPool(CPU)
    apply_recompute(mod, block_policies(plan, MODEL.num_layers), pool, memory)
    memory.count_weights()
    return mod, memory, pool, plan


def _batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, MODEL.vocab_size, (2, MODEL.seq_len), generator=g),
            torch.randint(0, MODEL.vocab_size, (2, MODEL.seq_len), generator=g))


def _simulated_activations(plan: Plan) -> float:
    per_block = sum(activation_bytes_per_layer(MODEL, plan, policy=p, mask_bytes=4)
                    for p in block_policies(plan, MODEL.num_layers))
    return per_block + embedding_activation_bytes(MODEL, plan, mask_bytes=4) + head_activation_bytes(MODEL, plan)


@pytest.mark.parametrize("policies", [["keep"] * 4, ["recompute"] * 4, ["swap"] * 4,
                                      ["keep", "recompute", "swap", "keep"]])
def test_saved_activations_match_the_simulator(policies):
    mod, memory, pool, plan = _stage(policies)
    x, y = _batch()
    with memory.saving(1):
        loss = lm_loss(mod(x), y)
        held = memory.terms.activations
        loss.backward()
    sim = _simulated_activations(plan)
    # Per-token LayerNorm statistics (1/h of the rest) are the only bytes the model leaves out.
    assert sim <= held <= 1.02 * sim, (held, sim)
    assert memory.terms.activations == 0 and memory.terms.transient == 0  # all released by the backward
    weights = sum(p.numel() * 4 for p in mod.parameters())
    assert memory.terms.weights == weights
    memory.refresh_gradients()
    assert memory.terms.gradients == weights
    if "swap" in policies:
        swapped = policies.count("swap") * activation_bytes_per_layer(MODEL, plan, policy="none", mask_bytes=4)
        assert pool.peak_bytes >= swapped and pool.live_bytes == 0
    else:
        assert pool.peak_bytes == 0


@pytest.mark.parametrize("policies", [["keep"] * 4, ["keep", "selective", "swap", "recompute"]])
def test_flash_attention_saves_what_the_simulator_says(policies):
    """plan.flash_attention: the executor's fused core (torch's flash kernel for CPU, no dropout here)
    keeps the per-row fp32 log-sum-exp where the explicit core kept the a·s² scores, as the
    simulator's memory model prices it (one owner of the rule: the plan)."""
    from .conftest import stage_saved_activations

    plan = Plan(micro_batch_size=2, global_batch_size=2, precision="fp32", layer_memory_policy=policies,
                flash_attention=True)
    held, _ = stage_saved_activations(MODEL, plan)
    sim = _simulated_activations(plan)
    assert sim <= held <= 1.02 * sim, (held, sim)
    explicit = _simulated_activations(dataclasses.replace(plan, flash_attention=False))
    assert sim < explicit  # the scores are gone wherever a block kept them


def test_a_recomputed_block_is_back_whole_a_swapped_one_tensor_by_tensor():
    mod, memory, _, plan = _stage(["keep", "keep", "keep", "recompute"])
    x, y = _batch()
    with memory.saving(1):
        lm_loss(mod(x), y).backward()
    whole = (activation_bytes_per_layer(MODEL, plan, policy="none", mask_bytes=4)
             - activation_bytes_per_layer(MODEL, plan, policy="full", mask_bytes=4))
    # The recompute re-saves the whole block but its input, which the block holds (its backward
    # comes right after the head's).
    assert whole <= memory.peak.transient <= 1.02 * whole, (memory.peak.transient, whole)
    assert memory.terms.transient == 0
    mod, memory, _, plan = _stage(["keep", "keep", "keep", "swap"])
    with memory.saving(1):
        lm_loss(mod(x), y).backward()
    # Swapped tensors come back one at a time as the backward asks: the peak stays the forward's.
    assert memory.peak.transient == 0 and memory.peak.activations == pytest.approx(_simulated_activations(plan), rel=0.02)


def test_swap_and_recompute_give_the_kept_gradients():
    grads = []
    for policies in (["keep"] * 4, ["swap"] * 4, ["keep", "recompute", "swap", "keep"]):
        mod, memory, _, _ = _stage(policies)
        x, y = _batch()
        with memory.saving(1):
            lm_loss(mod(x), y).backward()
        grads.append([p.grad.clone() for p in mod.parameters()])
    for other in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(grads[0], other, strict=True))


def test_budget_stops_the_step_with_the_terms():
    mod, memory, _, _ = _stage(["keep"] * 4)
    memory.budget = memory.terms.weights + 1000  # room for the weights, not for a forward
    x, y = _batch()
    rule = r"--memory-budget-gib: pipeline rank 0 \(stages \[0\]\) needs .* GiB at step 3 \(weights .*activations .*\), over"
    with pytest.raises(ContractError, match=rule), memory.saving(3):
        lm_loss(mod(x), y).backward()


def test_optimizer_state_is_counted():
    mod, memory, _, _ = _stage(["keep"] * 4)
    opt = torch.optim.AdamW(mod.parameters())
    x, y = _batch()
    with memory.saving(1):
        lm_loss(mod(x), y).backward()
    opt.step()
    memory.refresh_optimizer([opt])
    weights = memory.terms.weights
    n_params = len(list(mod.parameters()))
    assert memory.terms.optimizer == 2 * weights + 4 * n_params  # exp_avg, exp_avg_sq, one fp32 step each


def test_stage_memory_record_is_validated():
    from mindpipe.traces.measured import StageMemory

    rec = StageMemory(peak_bytes=10, source="tensor_accounting", accounted_peak_bytes=10, weights_bytes=4,
                      gradients_bytes=2, optimizer_bytes=2, activations_bytes=1, transient_bytes=1)
    with pytest.raises(ContractError, match="source"):
        dataclasses.replace(rec, source="rss")
    with pytest.raises(ContractError, match="sum of its terms"):
        dataclasses.replace(rec, accounted_peak_bytes=11)
    with pytest.raises(ContractError, match="budget_bytes"):
        dataclasses.replace(rec, budget_bytes=0)


@pytest.mark.gpu
def test_cuda_swap_uses_pinned_memory_and_matches_kept():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    dev = torch.device("cuda")
    grads, pools = [], []
    for policy in ("keep", "swap"):
        plan = Plan(micro_batch_size=2, global_batch_size=2, precision="fp32", layer_memory_policy=[policy] * 4)
        mod = build_stage_modules(build_gpt(MODEL, seed=0), plan, 0)[0].to(dev)
        memory, pool = MemoryAccount([mod], dev, "rank 0"), HostPool(dev)
        apply_recompute(mod, block_policies(plan, MODEL.num_layers), pool, memory)
        memory.count_weights()
        x, y = (t.to(dev) for t in _batch())
        with memory.saving(1):
            lm_loss(mod(x), y).backward()
        torch.cuda.synchronize()
        grads.append([p.grad.cpu() for p in mod.parameters()])
        pools.append(pool)
    assert pools[1].peak_bytes > 0 and pools[1].stream is not None
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_host_copy_keeps_a_dense_tensors_strides():
    """A swapped tensor comes back laid out as it left: a compiled backward asserts the strides of
    what it saved (an H200 run of fp8's compiled linears under swap failed on a contiguous copy of a
    transposed weight cast). A view of its storage comes back with its offset and strides, an
    expanded one too; a view of a much larger storage is copied alone, in its own layout where it
    is dense (:func:`host_buffer`), and views of one storage share one copy both ways."""
    t = torch.randn(16, 8).t()
    buf = host_buffer(t, pin=False)
    assert buf.shape == t.shape and buf.stride() == t.stride() == (1, 8)
    assert host_buffer(torch.randn(8, 1).expand(8, 4), pin=False).stride() == (4, 1)
    pool = HostPool(CPU)
    base = torch.randn(4, 6)
    wide = torch.randn(8, 1).expand(8, 4)
    big = torch.randn(64, 8)
    cases = [t, base.t(), base.view(24), wide, big[:4].t()]
    packed = [pool.pack(x) for x in cases]
    for x, p in zip(cases, packed, strict=True):
        back = pool.unpack(p)
        assert back.shape == x.shape and back.stride() == x.stride() and torch.equal(back, x)
    # base.t() and base.view(24): one storage, one copy; big[:4].t() alone: its 32 values, not 512.
    assert pool.live_bytes == 4 * (16 * 8 + 24 + 8 + 32)
    assert packed[1].store is packed[2].store


@pytest.mark.gpu
def test_cuda_swap_brings_a_transposed_tensor_back_transposed():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    dev = torch.device("cuda")
    pool = HostPool(dev)
    t = torch.randn(64, 32, device=dev).t()
    back = pool.unpack(pool.pack(t))
    torch.cuda.synchronize()
    assert back.device.type == "cuda" and back.stride() == t.stride() and torch.equal(back, t)


def test_saved_outputs_are_released_after_a_retained_input_gradient_pass():
    # Zero-bubble schedules run the loss's backward once with retain_graph=True (the input-gradient
    # pass) and never again; log_softmax saves its *output*. Holding that output with its grad_fn
    # would keep it alive through autograd's C++ graph for ever (~12 MiB per micro-batch per step).
    import gc

    lin = torch.nn.Linear(32, 512)
    acc = MemoryAccount([lin], torch.device("cpu"), "rank 0")
    acc.count_weights()
    x = torch.randn(64, 32, requires_grad=True)
    target = torch.randint(0, 512, (64,))
    with acc.saving(1):
        loss = lm_loss(lin(x), target)
    assert acc.terms.activations > 0
    torch.autograd.grad(loss, [x], retain_graph=True)
    loss.detach_()
    del loss
    gc.collect()
    assert acc.terms.activations == 0


@pytest.mark.parametrize("policies", [["keep", "keep"], ["recompute", "keep"], ["swap", "keep"],
                                      ["recompute", "recompute"]])
def test_split_backward_holds_what_the_simulator_says_until_w(policies):
    """torch's I (``stage_backward_input``, retain_graph) keeps a stage's graph for W: between them
    the last stage still holds its blocks and the head's inputs, not the loss's log-softmax; W, in
    one pass as the executor runs it (``one_weight_pass``), re-runs a recomputed block once, one
    block's re-run at a time, after the blocks above it freed theirs (the simulator's transient)."""
    from mindpipe.executor.stages import StageModule
    from mindpipe.executor.torch_pipelining import mergeable, merged_param_group
    from mindpipe.simulator.memory import StageMemoryModel
    from mindpipe.traces.catalog import get_device
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    plan = Plan(pp=2, micro_batch_size=2, global_batch_size=4, precision="fp32", schedule="zb_h1",
                layer_memory_policy=["keep", "keep", *policies])
    mod = StageModule(build_gpt(MODEL, seed=0), 2, 2, False, True)
    memory = MemoryAccount([mod], CPU, "pipeline rank 1 (stages [1])")
    apply_recompute(mod, block_policies(plan, MODEL.num_layers), HostPool(CPU), memory)
    memory.count_weights()
    x = torch.randn(2, MODEL.seq_len, MODEL.hidden_size, requires_grad=True)
    _, y = _batch()
    terms = StageMemoryModel(MODEL, plan, get_device("cpu"), None, None, split_backward=True).stage(
        [{"keep": "none", "recompute": "full", "swap": "swap"}[p] for p in policies], False, True)  # type: ignore[misc]
    with memory.saving(1):
        loss = lm_loss(mod(x), y)
        after_f = memory.terms.activations
        _, groups = stage_backward_input([loss], None, [x], mod.parameters())
        after_i = memory.terms.activations
        peaks: list[int] = []
        account = memory._set

        def spy(**kw: int) -> None:
            account(**kw)
            peaks.append(memory.terms.activations + memory.terms.transient)

        memory._set = spy  # type: ignore[method-assign]
        assert groups is not None and mergeable(groups)
        # The output gradients I keeps for W, one per parameter group (storages counted once).
        kept = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for g in groups for grads in g["grads"] for t in grads if isinstance(t, torch.Tensor)}
        stage_backward_weight(mod.parameters(), [merged_param_group(groups)])
        del groups
    # Per-token LayerNorm statistics (1/h of the rest) are the only bytes the model leaves out.
    assert terms.per_microbatch_bytes <= after_f <= 1.02 * terms.per_microbatch_bytes, (after_f, terms)
    # The model's held bytes after I also count the gradients I keeps for W: the logits' (4·s·b·V
    # here) and every parameter group's output gradient (two blocks' and the final norm's,
    # 23·s·b·h fp32 elements) — stored gradients, not saved tensors, so these activations do not
    # see them (a run's accounting counts them as transient: MemoryAccount.wrap_stage).
    logits_grad = 4 * MODEL.seq_len * 2 * MODEL.vocab_size
    grads = 2 * weight_pass_grad_bytes(MODEL, plan) + final_norm_grad_bytes(MODEL, plan)
    assert grads == 23 * 4 * MODEL.seq_len * 2 * MODEL.hidden_size
    assert sum(kept.values()) == logits_grad + grads
    held = terms.after_input_bytes - logits_grad - grads
    assert held <= after_i <= 1.02 * held, (after_i, terms)
    assert after_i < after_f  # I freed the log-softmax
    if "recompute" in policies:
        one_block = (activation_bytes_per_layer(MODEL, plan, policy="none", mask_bytes=4)
                     - activation_bytes_per_layer(MODEL, plan, policy="full", mask_bytes=4))  # all but the input
        # W's re-run (the loss's backward ran in I), one block at a time, beside what the layers above
        # it still hold: the pass walks down from the stage's top and frees each layer's saved
        # tensors as it leaves it, so a recomputed block under a kept one re-runs in the room that
        # one freed (StageMemoryModel.merged_pass_reruns: none beyond W's start; under the head and
        # a recomputed block, which holds only its input, one block's re-run less the head's inputs).
        # The head's inputs (the final norm's and the LM head's) go first.
        want = max(0.0, one_block - 2 * 4 * MODEL.seq_len * 2 * MODEL.hidden_size) if policies[-1] == "recompute" else 0.0
        assert terms.transient("W", 0)[0] == want
        assert max(peaks) - after_i <= want + 0.02 * one_block, (max(peaks) - after_i, want)
        if want:
            assert max(peaks) - after_i >= want - 0.02 * one_block, (max(peaks) - after_i, want)


def _prefetch_run(dev: torch.device, policy: str) -> tuple[list[torch.Tensor], HostPool, list[int], int]:
    """Two micro-batches as 1F1B's first stage runs them (F0 F1 B0 B1), B0's last swapped block
    prefetched under F1; returns the gradients, the pool, the transient bytes after each copy
    back, and the bytes the prefetch brought back."""
    plan = Plan(micro_batch_size=2, global_batch_size=2, precision="fp32", layer_memory_policy=[policy] * 4)
    mod = build_stage_modules(build_gpt(MODEL, seed=0), plan, 0)[0].to(dev)
    memory, pool = MemoryAccount([mod], dev, "rank 0"), HostPool(dev)
    seen: list[int] = []
    count = memory.transient

    def counted(t: torch.Tensor) -> None:
        count(t)
        seen.append(memory.terms.transient)

    memory.transient = counted  # type: ignore[method-assign]  # what apply_recompute's swap hands each copy
    apply_recompute(mod, block_policies(plan, MODEL.num_layers), pool, memory)
    memory.count_weights()
    (x0, y0), (x1, y1) = ((t.to(dev) for t in _batch(seed)) for seed in (1, 2))
    with memory.saving(1):
        pool.group = (0, 0)
        out0 = mod(x0)
        pool.group = None
        ahead = pool.prefetch((0, 0), memory.transient)  # as F1 starts
        pool.group = (0, 1)
        out1 = mod(x1)
        pool.group = None
        lm_loss(out0, y0).backward()
        pool.release((0, 0))
        lm_loss(out1, y1).backward()  # not prefetched: its last block as asked, then the chain
        pool.release((0, 1))
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return [p.grad.cpu() for p in mod.parameters()], pool, seen, ahead


def test_swapped_blocks_come_back_one_ahead_and_train_as_kept():
    """vPipe's prefetch as the executor runs it (offload.install_prefetch's mechanism): the last
    swapped block comes back before the backward; each swapped block's first use starts the copy of
    the next one below it, so at most two blocks are back at once; the gradients equal keeping's.
    A block's bytes are what the memory model counts for it: the pool copies a storage once however
    many views of it the block saves (attention's softmax output: two; per view it moved 11 % more)."""
    kept, _, _, _ = _prefetch_run(CPU, "keep")
    grads, pool, seen, ahead = _prefetch_run(CPU, "swap")
    plan = Plan(micro_batch_size=2, global_batch_size=2, precision="fp32")
    block = activation_bytes_per_layer(MODEL, plan, policy="none", mask_bytes=4)
    assert block <= ahead <= 1.01 * block, (ahead, block)  # the prefetch: one block
    assert 2 * block <= max(seen) <= 2.02 * block, (max(seen), block)
    assert not pool.blocks and not pool.fetched and not pool.started and pool.live_bytes == 0
    assert all(torch.equal(a, b) for a, b in zip(kept, grads, strict=True))


@pytest.mark.gpu
def test_cuda_prefetch_copies_back_on_its_stream_and_matches_kept():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    dev = torch.device("cuda")
    kept, _, _, _ = _prefetch_run(dev, "keep")
    grads, pool, seen, _ = _prefetch_run(dev, "swap")
    assert seen and pool.in_stream is not None and pool.live_bytes == 0
    for a, b in zip(kept, grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


SMALL_LLAMA = Model(kind="llama", num_layers=4, hidden_size=32, num_heads=4, num_kv_heads=2, ffn_hidden_size=64,
                    seq_len=16, vocab_size=64, name="llama-tiny4")
SMALL_GPT = Model(kind="gpt", num_layers=4, hidden_size=32, num_heads=4, seq_len=16, vocab_size=64, name="gpt-tiny4")


@pytest.mark.parametrize("flash", [False, True], ids=["eager", "flash"])
@pytest.mark.parametrize("policy", ["selective", "recompute"])
@pytest.mark.parametrize("model", [SMALL_GPT, SMALL_LLAMA], ids=["gpt", "llama"])
def test_a_split_backwards_input_pass_reruns_what_the_model_counts(model, policy, flash):
    """A block's re-run in a split backward's I (nothing freed: the graph is kept for W) as the model
    counts it (``StageTerms.transient("I", 0)``), per kind and attention kernel. The re-run saves its
    input again from the storage the block holds, and FlashAttention's q, k and v are the ones the
    block holds: aliases, counted once. Selective: the eager core's contiguous copies of q, k and v
    (Llama's too: 12,288 bytes uncounted before) or FlashAttention's output and log-sum-exp (the
    output uncounted before: −3.9 / −4.4 % per action on this Llama under ZB-V). The accounting
    misses only the log-sum-exp (it needs no gradient), 4·a·s·b bytes."""
    from mindpipe.simulator.memory import StageMemoryModel
    from mindpipe.traces import torch_gpt, torch_llama
    from mindpipe.traces.catalog import get_device
    from torch.distributed.pipelining.stage import stage_backward_input

    torch.manual_seed(0)
    block = torch_llama.Block(model) if model.is_llama else torch_gpt.Block(model)
    block.attn.flash = flash
    holder = torch.nn.Module()
    holder.blocks = torch.nn.ModuleDict({"0": block})
    memory = MemoryAccount([holder], CPU, "rank 0")
    block_policy = "full" if policy == "recompute" else "selective"  # the plan's name, the block's
    apply_recompute(holder, [block_policy], None, memory)  # type: ignore[arg-type]
    b = 3
    x = torch.randn(b, model.seq_len, model.hidden_size, requires_grad=True)
    with memory.saving(0):
        h = x * 1.0
        out = block(h)
        memory.peak = memory.terms
        _, groups = stage_backward_input([out], [torch.ones_like(out)], [h], block.parameters())
        # what I keeps for W, counted at its end as the executor does (MemoryAccount.watch_kept_gradients)
        for t in (t for g in groups for grads in g["grads"] for t in grads if isinstance(t, torch.Tensor)):
            memory.transient(t)
    plan = Plan(pp=2, schedule="zb_h1", micro_batch_size=b, global_batch_size=2 * b, precision="fp32",
                flash_attention=flash, layer_memory_policy=[policy] * 4)
    mm = StageMemoryModel(model, plan, get_device("cpu"), None, None, split_backward=True)
    terms = mm.stage([block_policy], False, False)
    lse = 4 * model.num_heads * model.seq_len * b if flash else 0
    rerun = mm.rerun_bytes() if policy == "recompute" else (
        mm.block("none") - mm.block("selective") + mm.core_qkv_copies() + mm.core_output())
    kept = weight_pass_grad_bytes(model, plan)
    # I's transient is its re-run, or at its end the gradients it keeps for W, whichever is larger
    assert terms.transient("I", 0)[0] == max(rerun, kept)
    assert memory.peak.transient == max(rerun - lse, kept), (memory.peak, rerun, kept)
