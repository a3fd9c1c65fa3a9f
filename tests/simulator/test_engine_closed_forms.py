"""Closed forms the engine must reproduce with uniform layer costs and free communication."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from mindpipe.simulator.api import SimulationOptions, simulate
from mindpipe.simulator.costs import LayerCost
from mindpipe.traces.config import Cluster, Model, Plan


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
