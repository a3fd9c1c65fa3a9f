"""Plan precision ``fp8``: refused before launch where the hardware or torchao is missing; torchao on CUDA."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util

import pytest
from mindpipe.executor.fp8 import fp8_refusal
from mindpipe.executor.precheck import check_run
from mindpipe.traces.catalog import get_device
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.errors import ContractError

from .conftest import STEPS, TINY, mindpipe, run_plan

FP8 = Plan(dp=2, global_batch_size=4, precision="fp8")


def test_fp8_refused_on_cpu_before_launch() -> None:
    res = mindpipe("run", '{"dp": 2, "global_batch_size": 4, "precision": "fp8"}', "--nproc", "2", "--steps", "1",
                   "--device", "cpu", "--model", '{"kind": "gpt", "num_layers": 2, "hidden_size": 32, "num_heads": 4, '
                   '"seq_len": 16, "vocab_size": 64}', timeout=120)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mindpipe: error: ") and "this run is on cpu" in lines[0]
    assert res.stdout == ""


def test_check_run_refuses_fp8_on_cpu() -> None:
    with pytest.raises(ContractError, match="precision 'fp8' needs a CUDA GPU with FP8 tensor cores"):
        check_run(Model(**TINY), FP8, 2, "cpu", get_device("cpu"))


def test_fp8_refusals_on_cuda() -> None:
    a100 = get_device("a100-sxm4-80gb")
    assert "a100-sxm4-80gb has none" in (fp8_refusal(FP8, "cuda", a100) or "")
    tp2 = dataclasses.replace(FP8, dp=1, tp=2, global_batch_size=2)
    assert "tp > 1" in (fp8_refusal(tp2, "cuda", get_device("h100-sxm5-80gb")) or "")
    assert fp8_refusal(dataclasses.replace(FP8, precision="bf16"), "cpu", None) is None
    on_h100 = fp8_refusal(FP8, "cuda", get_device("h100-sxm5-80gb"))
    if importlib.util.find_spec("torchao") is None:
        assert on_h100 is not None and "needs torchao" in on_h100
    else:
        assert on_h100 is None


@pytest.mark.gpu
def test_fp8_run_on_cuda_uses_torchao(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability(0) < (8, 9) or importlib.util.find_spec("torchao") is None:
        pytest.skip("needs a CUDA GPU with FP8 tensor cores (compute capability >= 8.9) and torchao")
    model = {"kind": "gpt", "num_layers": 2, "hidden_size": 256, "num_heads": 4, "seq_len": 64, "vocab_size": 256}
    res = run_plan(tmp_path, {"micro_batch_size": 2, "global_batch_size": 8, "precision": "fp8"}, 1,
                   "--device", "cuda", model=model)
    assert res.returncode == 0, res.stderr[-4000:]
    from mindpipe.traces.trace import Trace

    m = Trace.load(tmp_path / "measured.json").measurement
    assert m is not None and m.device_kind == "cuda" and len(m.losses) == STEPS
    assert all(loss > 0 for loss in m.losses)


def test_compile_modules_compiles_each_module_of_the_kind_in_place() -> None:
    """The fp8 path compiles each ``Float8Linear`` (torchao's casts are separate kernels in eager
    mode); here plain linears stand in, on CPU, with a backend that needs no compiler."""
    torch = pytest.importorskip("torch")
    from mindpipe.executor.fp8 import compile_modules

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16), torch.nn.Linear(16, 16))
    ref = copy.deepcopy(net)
    first = net[0]
    x = torch.randn(4, 16)
    assert compile_modules(net, torch.nn.Linear, backend="aot_eager") == 3
    assert net[0] is first and all(getattr(m, "_compiled_call_impl", None) is not None for m in net if isinstance(m, torch.nn.Linear))
    assert getattr(net[1], "_compiled_call_impl", None) is None  # only the kind asked for
    out, want = net(x), ref(x)
    torch.testing.assert_close(out, want)
    out.square().sum().backward()
    want.square().sum().backward()
    for a, b in zip(net.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    assert torch._dynamo.config.cache_size_limit >= 3
