"""The executor's half of a tied LM head on a pipeline: sum the two tables' gradients before the step.

The rule — which stages hold the token table and its copy, and that their gradients are summed
after the last backward — is :func:`mindpipe.traces.layout.tied_table_ranks`; the copy itself is
made by :func:`mindpipe.executor.stages.build_stage_modules`. Both tables start equal (the copy is
cloned from the table the seed drew), so after the sum they receive the same gradient, which is the
single-process model's gradient of its one shared table, and AdamW keeps them equal.

The two tables have the same shape and the same sharding (``Shard(0)`` over ``tp`` for the
vocabulary-parallel table and the column-parallel head; FSDP2 or replication over the gradient
replicas on top), so each rank sums its local pieces with its peer's: an all-reduce over a group of
the two pipeline ranks at the same (dp, cp, tp) coordinates (Megatron-LM's embedding group), or an
in-place add when one rank holds both stages (a "V" schedule). Under ZeRO ≥ 1 the local piece is
the rank's reduce-scattered shard, so the exchange moves 1/(dp·cp) of the table.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from mindpipe.executor.offload import local_tensor
from mindpipe.executor.stages import StageModule
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.layout import tied_table_ranks
from torch.distributed.device_mesh import DeviceMesh


class TiedTable:
    """This rank's tables of a tied head and the group it sums their gradients with (module docstring)."""

    def __init__(self, plan: Plan, model: Model, mesh: DeviceMesh, modules: dict[int, StageModule]) -> None:
        ranks = tied_table_ranks(plan, model)
        self.params: list[torch.Tensor] = []  # the tables' weights (Parameters; torch types them as tensors)
        self.group: dist.ProcessGroup | None = None
        if ranks is None:
            return
        first, last = modules.get(0), modules.get(plan.num_stages - 1)
        if first is not None and first.embedding is not None:
            self.params.append(first.embedding.tok.weight)
        if last is not None and last.lm_head is not None:
            self.params.append(last.lm_head.out.weight)
        if ranks[0] == ranks[1]:
            return
        # Every rank makes every pair's group, in the same order (torch's rule for new_group).
        names = list(mesh.mesh_dim_names or ())
        grid = mesh.mesh.movedim(names.index("pp"), -1).reshape(-1, plan.pp)
        me = dist.get_rank()
        for row in grid.tolist():
            pair = [row[ranks[0]], row[ranks[1]]]
            group = dist.new_group(pair)
            if me in pair:
                self.group = group

    @torch.no_grad()
    def sum_gradients(self) -> None:
        """Make each table's gradient the sum of both (call after the schedule's step, before the optimizer's)."""
        if not self.params:
            return
        grads = [p.grad for p in self.params]
        if any(g is None for g in grads):
            raise RuntimeError("a tied token table has no gradient after the backward")
        pieces = [local_tensor(g) for g in grads if g is not None]  # the storage itself: summed in place
        if len(pieces) == 2:  # one rank holds both stages
            pieces[0].add_(pieces[1])
            pieces[1].copy_(pieces[0])
        elif self.group is not None:
            dist.all_reduce(pieces[0], group=self.group)


__all__ = ["TiedTable"]
