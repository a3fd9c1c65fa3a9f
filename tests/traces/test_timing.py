"""measure_unit's B/W split, including the fallback when W is lost in timing noise."""

from __future__ import annotations

import torch
from mindpipe.traces.timing import Clock, measure_unit


class ScriptedClock(Clock):
    """Runs each function and returns the next scripted duration (forward, B, full backward, ...)."""

    def __init__(self, durations: list[float]) -> None:
        super().__init__(torch.device("cpu"))
        self.durations = list(durations)

    def time(self, fn):  # type: ignore[no-untyped-def]
        fn()
        return self.durations.pop(0)


def _unit() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return torch.nn.Linear(16, 16), torch.randn(4, 16)


def test_w_is_full_minus_b_when_timings_are_clean():
    lin, x = _unit()
    clock = ScriptedClock([1.0, 2.0, 5.0] * 3)  # forward 1, B 2, full backward 5 -> W 3
    cost = measure_unit(lin, [x], list(lin.parameters()), clock, warmup=0, repeats=3)
    assert cost.forward_s == 1.0 and cost.backward_input_s == 2.0 and cost.backward_weight_s == 3.0
    assert cost.stats["w_from_flops"] == 0.0


def test_w_falls_back_to_flop_share_when_noise_hides_it():
    lin, x = _unit()
    clock = ScriptedClock([1.0, 5.0, 4.0] * 3)  # full backward "faster" than B alone: noise
    cost = measure_unit(lin, [x], list(lin.parameters()), clock, warmup=0, repeats=3)
    # A linear layer's B and W are one GEMM each of equal FLOPs: the 4 s backward splits in half.
    assert cost.stats["w_from_flops"] == 1.0
    assert abs(cost.backward_weight_s - 2.0) < 1e-9 and abs(cost.backward_input_s - 2.0) < 1e-9
    assert cost.backward_weight_s + cost.backward_input_s == 4.0
