"""Built-in supernets (resolved by :func:`mindpipe.traces.builtin.load_network`).

``supernet-mini`` is a tiny CPU space for tests and the executor. ``naspipe-c1``/``-c2``/``-c3``
follow NASPipe's translation spaces (hku-systems/naspipe ``throughput/translation/config.py``,
BACKGROUND.md §5): 48 choice layers (its 24 encoder + 24 decoder layers, here one decoder-only
stack), d_model 1024, FFN 4096, its WMT'14 En-De joined vocabulary of 33,712 entries and 128-token
sequences (the runtime's tensor shapes ``[60, 128]`` per 60-sentence micro-batch). The candidate
operators are NASPipe's: multi-head attention with 4/8/16 heads, a 4096-wide feed-forward (its
GLU's stand-in), standard convolutions k ∈ {1, 3, 5}, separable convolutions k ∈ {3, 5, 7, 9, 11}
(c1: those 12) and lightweight convolutions k ∈ {3, 5, 7, 15} × r ∈ {1, 4, 16} heads (c2: 24).
NASPipe's third space has 48 choices per layer, but its op list names only 24; ``naspipe-c3``
holds two independent instances of each (an estimate of that space's size, not of its ops).
"""

from __future__ import annotations

from typing import Any


def _naspipe_candidates(size: int) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = [{"name": f"attn{a}", "op": "attention", "num_heads": a} for a in (4, 8, 16)]
    ops.append({"name": "ffn4096", "op": "ffn", "ffn_hidden_size": 4096})
    ops += [{"name": f"conv{k}", "op": "conv", "kernel_size": k, "conv_type": "standard"} for k in (1, 3, 5)]
    ops += [{"name": f"sepconv{k}", "op": "conv", "kernel_size": k, "conv_type": "separable"} for k in (3, 5, 7, 9, 11)]
    if size >= 24:
        ops += [{"name": f"lwconv{k}r{r}", "op": "conv", "kernel_size": k, "conv_type": "lightweight", "conv_heads": r}
                for k in (3, 5, 7, 15) for r in (1, 4, 16)]
    if size >= 48:
        ops += [{**c, "name": f"{c['name']}_b"} for c in ops]
    return ops


def _naspipe(size: int) -> dict[str, Any]:
    return {"kind": "supernet", "num_layers": 48, "hidden_size": 1024, "seq_len": 128, "vocab_size": 33712,
            "candidates": _naspipe_candidates(size)}


BUILTIN_SUPERNETS: dict[str, dict[str, Any]] = {
    # Tiny, for CPU tests and the executor: 8 choice layers of 6 candidates (conflict chance per
    # layer 1/6), each a few hundred microseconds on one core at micro-batch 4.
    "supernet-mini": {
        "kind": "supernet", "num_layers": 8, "hidden_size": 64, "seq_len": 32, "vocab_size": 512,
        "candidates": [
            {"name": "attn2", "op": "attention", "num_heads": 2},
            {"name": "attn4", "op": "attention", "num_heads": 4},
            {"name": "ffn128", "op": "ffn", "ffn_hidden_size": 128},
            {"name": "ffn256", "op": "ffn", "ffn_hidden_size": 256},
            {"name": "sepconv3", "op": "conv", "kernel_size": 3},
            {"name": "lwconv5", "op": "conv", "kernel_size": 5, "conv_type": "lightweight", "conv_heads": 4},
        ],
    },
    "naspipe-c1": _naspipe(12),
    "naspipe-c2": _naspipe(24),
    "naspipe-c3": _naspipe(48),
}


def supernet_names() -> list[str]:
    """Names of the built-in supernets."""
    return sorted(BUILTIN_SUPERNETS)


__all__ = ["BUILTIN_SUPERNETS", "supernet_names"]
