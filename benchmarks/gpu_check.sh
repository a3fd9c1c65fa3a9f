#!/bin/bash
# The CUDA path on one GPU, in sections (all of them by default, in this order):
#   env      the GPU, the driver, torch and torchao
#   tests    the GPU-marked tests (3 pytest workers share the GPU; timings are not asserted)
#   loop     MindPipe's loop on one GPU: a layer profile of a 4-block GPT at h 4096 (s 2048,
#            V 32k, bf16, fused attention), then 8 single-GPU training runs of it (micro-batch
#            1/2/4, full and selective recompute, swap-all, a per-block mix; fp8 in `fp8`) for
#            `gpu_loop_report.py` to simulate with and without the profile and calibrate on
#   fp8      the loop model in fp8 with each Float8Linear compiled (the executor's default) beside
#            a per-block memory mix (compiled linears under recompute, swap and nongemm's hooks), and
#            the fp8 GPU test
#   prefetch benchmarks/swap_prefetch.py (the copy back of swapped activations under the action
#            before the backward), and the loop's micro-batch-2 run again with fused AdamW
#   compute  layer profiles of a Llama-3-8B-shaped and a GPT-3-175B-shaped slice (the analytic
#            GPU model's compute against this GPU)
#   open     questions the 2026-11-27 H100 runs left open: which attention kernel SDPA runs,
#            the memory outside the allocator (CUDA context, NCCL, cuBLAS), torch's MemTracker at
#            the peak, an operator-level Llama profile, a run whose vocabulary differs from a·s
#   memory   single-GPU runs of a 4-block GPT (h 1024) under every memory policy and precision,
#            with the allocator's peak per run (the 2026-11-27 H100 table)
#
#   bash benchmarks/gpu_check.sh [OUT_DIR] [SECTION ...]     (default benchmarks/results/gpu)
#   .venv/bin/python benchmarks/gpu_check_report.py [OUT_DIR]    (on any machine: memory and compute)
#   .venv/bin/python benchmarks/gpu_loop_report.py [OUT_DIR]     (on any machine: the loop's fidelity)
#
# Time on an H200 (2026-12-04): env 6 s, tests 42 s, loop 4 min, fp8 about 3 min (its first step
# compiles the linears), compute 80 s, open 55 s, memory about 2 min: about 12 minutes in all, so a
# 15-minute lease takes two calls (e.g. `env tests loop fp8`, then `compute open memory`).
#
# GPU_CHECK_PACK=FILE.tgz packs OUT_DIR into FILE after every step, so a run stopped by a time
# limit still leaves what it measured. Needs mindpipe installed with a CUDA build of torch (and
# torchao for fp8). It leaves the GPU's clocks alone: the NVML clock-lock test is skipped here (it
# changes a device setting), and no plan sets stage clocks.
set -u
OUT=${1:-benchmarks/results/gpu}
shift || true
SECTIONS=${*:-env tests loop fp8 compute open memory}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
el() { echo "=== [$(( $(date +%s) - t0 ))s] $*"; }
pack() { [ -n "${GPU_CHECK_PACK:-}" ] && tar czf "$GPU_CHECK_PACK" -C "$OUT" . 2>/dev/null; true; }
run() {  # run NAME PLAN: one single-GPU training run of $MODEL
  el "run $1"
  mindpipe run "$2" --nproc 1 --steps "${STEPS:-4}" --device cuda --model "$MODEL" --out "$OUT/run_$1.json" --run-timeout 150 \
    ${PROFILE_STEP:+--profile-step "$PROFILE_STEP"}
  pack
}

section_env() {
  el "gpu"
  nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm,driver_version --format=csv
  python3 -c "import torch, importlib.util as u; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), 'torchao', u.find_spec('torchao') is not None)"
}

section_tests() {
  el "GPU-marked tests"
  python3 -m pytest -q -m gpu -p no:cacheprovider -n 3 --timeout 200 -k "not gpu_lock" \
    tests/traces/test_profiler.py tests/executor/test_exec_gpu.py tests/executor/test_exec_fp8.py \
    tests/executor/test_exec_memory.py tests/executor/test_supernet_exec.py tests/executor/test_exec_ring_attention.py \
    tests/executor/test_exec_clocks.py \
    2>&1 | tail -40
}

section_loop() {
  MODEL='{"kind":"gpt","num_layers":4,"hidden_size":4096,"num_heads":32,"seq_len":2048,"vocab_size":32768,"name":"gpt-4k"}'
  el "loop: profile gpt-4k (micro-batch 2)"
  mindpipe profile "$MODEL" --device cuda --dtype bf16 --flash-attention --micro-batch-size 2 --warmup 3 --repeats 10 \
    --out "$OUT/profile_gpt-4k_mb2.json"
  pack
  local P='"global_batch_size":8,"flash_attention":true'
  STEPS=7 PROFILE_STEP=7  # the last step's collectives recorded, as the demo's runs do (calibration reads them)
  run loop_mb2_keep "{\"micro_batch_size\":2,$P,\"precision\":\"bf16\"}"
  run loop_mb1_keep "{\"micro_batch_size\":1,$P,\"precision\":\"bf16\"}"
  run loop_mb4_keep "{\"micro_batch_size\":4,$P,\"precision\":\"bf16\"}"
  run loop_mb2_full "{\"micro_batch_size\":2,$P,\"precision\":\"bf16\",\"recompute\":\"full\"}"
  run loop_mb2_selective "{\"micro_batch_size\":2,$P,\"precision\":\"bf16\",\"recompute\":\"selective\"}"
  run loop_mb2_swap "{\"micro_batch_size\":2,$P,\"precision\":\"bf16\",\"layer_memory_policy\":[\"swap\",\"swap\",\"swap\",\"swap\"]}"
  run loop_mb2_mixed "{\"micro_batch_size\":2,$P,\"precision\":\"bf16\",\"layer_memory_policy\":[\"keep\",\"recompute\",\"swap\",\"nongemm\"]}"
  STEPS=4 PROFILE_STEP=
}

section_fp8() {
  MODEL='{"kind":"gpt","num_layers":4,"hidden_size":4096,"num_heads":32,"seq_len":2048,"vocab_size":32768,"name":"gpt-4k"}'
  local P='"global_batch_size":8,"flash_attention":true'
  STEPS=7 PROFILE_STEP=7
  run loop_mb2_fp8 "{\"micro_batch_size\":2,$P,\"precision\":\"fp8\"}"
  run fp8_mb2_mixed "{\"micro_batch_size\":2,$P,\"precision\":\"fp8\",\"layer_memory_policy\":[\"keep\",\"recompute\",\"swap\",\"nongemm\"]}"
  STEPS=4 PROFILE_STEP=
  python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 200 tests/executor/test_exec_fp8.py 2>&1 | tail -5
}

section_prefetch() {  # stop 63: vPipe's prefetch of swapped activations, and the fused AdamW step
  el "swap prefetch (first stage's F0 F1 B0 on one GPU)"
  python3 benchmarks/swap_prefetch.py --out "$OUT/swap_prefetch.json" 2>&1 | tail -12
  pack
  MODEL='{"kind":"gpt","num_layers":4,"hidden_size":4096,"num_heads":32,"seq_len":2048,"vocab_size":32768,"name":"gpt-4k"}'
  local P='"global_batch_size":8,"flash_attention":true'
  STEPS=7 PROFILE_STEP=7
  run loop_mb2_keep_fused_adamw "{\"micro_batch_size\":2,$P,\"precision\":\"bf16\"}"
  STEPS=4 PROFILE_STEP=
}

section_compute() {
  el "profiles (bf16, fused attention)"
  mindpipe profile '{"kind":"llama","num_layers":2,"hidden_size":4096,"num_heads":32,"num_kv_heads":8,"ffn_hidden_size":14336,"vocab_size":128256,"seq_len":8192,"name":"llama3-8b-2l"}' \
    --device cuda --dtype bf16 --flash-attention --warmup 2 --repeats 5 --out "$OUT/profile_llama3-8b-2l.json"
  pack
  mindpipe profile '{"kind":"gpt","num_layers":1,"hidden_size":12288,"num_heads":96,"vocab_size":51200,"seq_len":2048,"name":"gpt3-175b-1l"}' \
    --device cuda --dtype bf16 --flash-attention --warmup 2 --repeats 5 --out "$OUT/profile_gpt3-175b-1l.json"
  pack
}

section_open() {
  # which kernel torch's SDPA runs for the profiled attention (FlashAttention-2, cuDNN, memory-efficient)
  el "SDPA kernels"
  python3 - <<'PY'
import torch
from torch.profiler import ProfilerActivity, profile
q = torch.randn(1, 32, 8192, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(1, 8, 8192, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
v = torch.randn_like(k, requires_grad=True)
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()
print(sorted({e.name[:90] for e in prof.events() if "attn" in e.name.lower() or "fmha" in e.name.lower() or "flash" in e.name.lower()}))
PY
  # what the memory model's per-GPU reserve is made of outside the allocator: device memory in use
  # before any tensor, after NCCL, after a matmul
  el "memory outside the allocator"
  MASTER_ADDR=127.0.0.1 MASTER_PORT=29533 RANK=0 WORLD_SIZE=1 python3 - <<'PY'
import torch, torch.distributed as dist
def used(): free, total = torch.cuda.mem_get_info(); return (total - free) / 2**20
torch.cuda.init(); torch.zeros(1, device="cuda"); a = used()
dist.init_process_group("nccl", device_id=torch.device("cuda", 0)); x = torch.ones(1 << 20, device="cuda"); dist.all_reduce(x)
torch.cuda.synchronize(); b = used()
y = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16); (y @ y).sum().item(); c = used()
print(f"context {a:.0f} MiB; + NCCL {b - a:.0f} MiB; + cuBLAS {c - b:.0f} MiB; allocator reserved {torch.cuda.memory_reserved() / 2**20:.0f} MiB")
dist.destroy_process_group()
PY
  # which category holds what the allocator sees beyond the memory model (torch's MemTracker at the peak)
  el "MemTracker at the peak"
  python3 benchmarks/mem_tracker_peak.py --device cuda
  python3 benchmarks/mem_tracker_peak.py --device cuda --vocab 32768
  # where the Llama block's time goes (operator granularity)
  el "op-granularity profile"
  mindpipe profile '{"kind":"llama","num_layers":1,"hidden_size":4096,"num_heads":32,"num_kv_heads":8,"ffn_hidden_size":14336,"vocab_size":32000,"seq_len":8192,"name":"llama3-8b-1l"}' \
    --device cuda --dtype bf16 --granularity op --warmup 2 --repeats 5 --out "$OUT/profile_llama3-8b-1l_ops.json"
  pack
  # whether the allocator's remaining gap is the logits or the attention scores (here V != a*s)
  MODEL='{"kind":"gpt","num_layers":4,"hidden_size":1024,"num_heads":16,"seq_len":512,"vocab_size":32768,"name":"gpt-1k-v32k"}'
  run bf16_mbs4_keep_v32k '{"micro_batch_size":4,"global_batch_size":8,"precision":"bf16"}'
}

section_memory() {
  MODEL='{"kind":"gpt","num_layers":4,"hidden_size":1024,"num_heads":16,"seq_len":512,"vocab_size":8192,"name":"gpt-1k"}'
  run fp32_mbs4_keep '{"micro_batch_size":4,"global_batch_size":8,"precision":"fp32"}'
  run fp32_mbs2_keep '{"micro_batch_size":2,"global_batch_size":8,"precision":"fp32"}'
  run bf16_mbs4_keep '{"micro_batch_size":4,"global_batch_size":8,"precision":"bf16"}'
  run bf16_mbs4_mixed '{"micro_batch_size":4,"global_batch_size":8,"precision":"bf16","layer_memory_policy":["keep","recompute","swap","nongemm"]}'
  run bf16_mbs4_swap '{"micro_batch_size":4,"global_batch_size":8,"precision":"bf16","layer_memory_policy":["swap","swap","swap","swap"]}'
  run bf16_mbs4_fused_head '{"micro_batch_size":4,"global_batch_size":8,"precision":"bf16","fused_head_loss":true,"loss_chunks":4}'
  run fp8_mbs4_keep '{"micro_batch_size":4,"global_batch_size":8,"precision":"fp8"}'
}

for s in $SECTIONS; do
  "section_$s"
  pack
done
el done
