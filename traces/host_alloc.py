"""How CPU ranks allocate memory: one rule for the executor that sets it and the simulator that prices it.

PyTorch's CPU allocator is glibc's ``malloc``. Left to its defaults, glibc serves a request at or
above its *mmap threshold* with a fresh ``mmap`` (and ``munmap`` on free), starts that threshold
at 128 KiB and raises it to the largest mmapped block freed, up to ``DEFAULT_MMAP_THRESHOLD_MAX``
(32 MiB on 64-bit hosts); below it, blocks come from the heap, whose free top is given back to the
kernel (``trim``) once it exceeds twice the threshold (mallopt(3): ``M_MMAP_THRESHOLD``,
``M_TRIM_THRESHOLD``). Every page that comes back from the kernel is faulted in and zeroed on first
touch. So whether a tensor's memory is fresh depended on what the process had freed before:
under a split backward (``zb_h1``) the last stage of ``gpt-tiny-8k`` at micro-batch 2 keeps one
more micro-batch's 8 MiB logits gradient alive between its I and its W, the heap's top grows and
is trimmed again each micro-batch, and its I measured 23.3 ms against 20.5 ms with the settings
below (medians of 3 interleaved rounds, ``benchmarks/host_alloc.py``).

A GPU rank's caching allocator keeps what it freed. The executor's CPU ranks now do the same below
the largest threshold glibc would reach on its own: :func:`rank_environment` pins the mmap
threshold at :data:`CPU_FRESH_ALLOC_BYTES` and never trims the heap. Then exactly the results of
:data:`CPU_FRESH_ALLOC_BYTES` or more are fresh each time (the rule the calibrated simulator prices:
:meth:`mindpipe.simulator.calibrate.models.ReferenceOpTime.fresh_bytes`), whatever ran before.
The process keeps the peak of its heap mapped, as a GPU rank keeps its allocator's reserved memory;
the executor's per-stage memory figures count live tensors, not mapped pages, and do not change (the
peak resident set it also reports may include freed memory the heap kept).

The settings are glibc's environment variables, read when a process starts: the launcher sets
them for the rank processes (:func:`set_rank_allocator`) (the one-host spawner, whose forks inherit its allocator, and
torchrun's ranks), unless the user chose any of glibc's malloc settings (either variable, or a
``glibc.malloc.*`` entry of ``GLIBC_TUNABLES``). Other C libraries ignore them.
"""

from __future__ import annotations

# glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit hosts (module docstring): results this large are mmapped.
CPU_FRESH_ALLOC_BYTES = 32 * 2**20

# Never give the heap's free top back to the kernel (mallopt accepts an int: 2 GiB - 1 is its largest).
_NO_TRIM = 2**31 - 1


def rank_environment() -> dict[str, str]:
    """The environment variables that give a CPU rank the allocator of the module docstring."""
    return {"MALLOC_MMAP_THRESHOLD_": str(CPU_FRESH_ALLOC_BYTES), "MALLOC_TRIM_THRESHOLD_": str(_NO_TRIM)}


def user_set_allocator(env: dict[str, str]) -> bool:
    """Whether ``env`` already chooses glibc's malloc settings (then the launcher leaves them)."""
    return (any(k in env for k in rank_environment())
            or any(t.strip().startswith("glibc.malloc.") for t in env.get("GLIBC_TUNABLES", "").split(":")))


def set_rank_allocator(env: dict[str, str]) -> None:
    """Give the CPU ranks started with ``env`` the allocator of the module docstring, unless ``env``
    already chooses glibc's malloc settings."""
    if not user_set_allocator(env):
        env.update(rank_environment())


__all__ = ["CPU_FRESH_ALLOC_BYTES", "rank_environment", "set_rank_allocator", "user_set_allocator"]
