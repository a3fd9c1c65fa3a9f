"""What a split backward (zero-bubble I and W, torch's ``stage_backward_input`` and
``stage_backward_weight``) holds beyond a stage's held activations while I and W run, walked in the
order torch runs them: :class:`SplitBackwardWalks`, a part of
:class:`mindpipe.simulator.memory.StageMemoryModel` (which owns the per-block bytes it walks over,
:meth:`~mindpipe.simulator.memory.StageMemoryModel.block`, and the rest of a stage's terms)."""

from __future__ import annotations

from mindpipe.simulator.activations import input_pass_steps, weight_pass_groups
from mindpipe.simulator.costs import DTYPE_BYTES
from mindpipe.traces.config import Model, Plan
from mindpipe.traces.layout import BlockPart, BlockPolicy


class SplitBackwardWalks:
    """The walks of a split backward's I and W over a stage's blocks (or parts), each with its
    policy; ``block`` is the stage memory model's bytes per block and policy."""

    model: Model
    plan: Plan
    seq_len: int | None

    def block(self, policy: BlockPolicy, part: BlockPart = "whole") -> float:
        """Bytes one block (or part) keeps per micro-batch under ``policy`` (the memory model's)."""
        raise NotImplementedError

    def merged_pass_reruns(self, policies: list[BlockPolicy], parts: list[BlockPart], rerun: dict[BlockPart, float],
                           above: float = 0.0) -> float:
        """The most a merged W pass (:func:`mindpipe.traces.layout.one_weight_pass`) holds for its
        re-runs beyond the stage's held activations: it walks the blocks from the stage's top down
        (after freeing ``above``, what the layers above the blocks held), freeing what each held as
        it leaves it, and re-runs each recomputed block (or part, ``rerun`` its bytes) when it
        reaches it."""
        freed, most = above, 0.0
        for policy, part in reversed(list(zip(policies, parts, strict=True))):
            if policy == "full":
                most = max(most, rerun[part] - freed)
            freed += self.block(policy, part)
        return most

    def input_pass_walk(self, policies: list[BlockPolicy], parts: list[BlockPart], above: float = 0.0) -> float:
        """The most a split backward's I without a prefetch holds beyond the stage's held activations
        for its swapped blocks and the gradients it keeps for W: it runs the blocks from the stage's
        top (``above``: what the layers above them kept, the final norm's gradient), making each
        group's kept gradient as it reaches it (:func:`input_pass_steps`), and a swapped block's
        tensors come back one operator at a time. Ends at every kept gradient (llama-tiny ZB-V, a
        swapped attention part: +5.7 % on its I when the largest tensor was counted beside all of them)."""
        made, most = above, 0.0
        for policy, part in reversed(list(zip(policies, parts, strict=True))):
            for kept, asked in input_pass_steps(self.model, self.plan, self.core_saved_bytes(part),
                                                seq_len=self.seq_len, part=part):
                made += kept
                if policy == "swap":
                    most = max(most, made + asked)
        return max(most, made)

    def core_saved_bytes(self, part: BlockPart = "whole") -> float:
        """What the attention core's backward unpacks at once: the softmax output (a·s²·b/t), or
        under FlashAttention its q, k, v and output ((2 + 2r)·s·b·h/t). 0 for an MLP part."""
        model, plan = self.model, self.plan
        if part == "mlp":
            return 0.0
        s, b, t, d = plan.rank_seq_len(self.seq_len or model.seq_len), plan.micro_batch_size, plan.tp, DTYPE_BYTES[plan.precision]
        if plan.flash_attention:
            return (2 + 2 * model.kv_heads / model.num_heads) * d * s * b * model.hidden_size / t
        return d * b * model.num_heads * s * s / t

    def weight_pass_walk(self, policies: list[BlockPolicy], parts: list[BlockPart], rerun: dict[BlockPart, float]) -> float:
        """The most a split backward's W of a stage other than the first holds beyond the stage's
        held activations when it takes torch's pass per parameter group, in the stage's order
        (:func:`weight_pass_groups`): a recomputed block (or part, ``rerun`` its re-run's bytes)
        re-runs in each of its groups' passes and what a pass does not use stays with the
        checkpoint's frame until W ends (an upper bound: a pass uses some); a swapped block brings
        back the tensor each group's weight gradient needs; and each group's pass frees the output
        gradient I kept for it. gpt-mini-sized ZB-H1 pp4, one swapped block per stage: the
        LayerNorm's input first (s·b·h), the GeLU output (4·s·b·h) after 10·s·b·h were freed
        (+3 % on the rank when W held them all beside the largest tensor)."""
        freed = reruns = most = 0.0
        for policy, part in zip(policies, parts, strict=True):
            for kept, asked in weight_pass_groups(self.model, self.plan, seq_len=self.seq_len, part=part):
                reruns += rerun.get(part, 0.0) if policy == "full" else 0.0
                most = max(most, reruns + (asked if policy == "swap" else 0.0) - freed)
                freed += kept
        return most


__all__ = ["SplitBackwardWalks"]
