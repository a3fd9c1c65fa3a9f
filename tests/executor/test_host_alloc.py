"""The CPU ranks' allocator settings (mindpipe.traces.host_alloc) as the launcher hands them over."""

from __future__ import annotations

import argparse

import pytest
from mindpipe.executor import launch
from mindpipe.traces.host_alloc import CPU_FRESH_ALLOC_BYTES, rank_environment, user_set_allocator

_ALLOC_KEYS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def _env(monkeypatch: pytest.MonkeyPatch, tmp_path, device: str, **user: str) -> dict[str, str]:
    for key in _ALLOC_KEYS:
        monkeypatch.delenv(key, raising=False)
    for key, value in user.items():
        monkeypatch.setenv(key, value)
    args = argparse.Namespace(nnodes="1", rdzv_endpoint=None, nproc=2)
    return launch._environment(args, device, tmp_path)


def test_cpu_ranks_pin_the_mmap_threshold_at_the_simulated_one_and_never_trim(monkeypatch, tmp_path):
    env = _env(monkeypatch, tmp_path, "cpu")
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(CPU_FRESH_ALLOC_BYTES) == str(32 * 2**20)
    assert int(env["MALLOC_TRIM_THRESHOLD_"]) >= 2**30


def test_gpu_ranks_keep_the_c_librarys_defaults(monkeypatch, tmp_path):
    env = _env(monkeypatch, tmp_path, "cuda")
    assert not any(key in env for key in _ALLOC_KEYS)


@pytest.mark.parametrize("user", [{"MALLOC_TRIM_THRESHOLD_": "131072"}, {"MALLOC_MMAP_THRESHOLD_": "65536"},
                                  {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX:glibc.malloc.trim_threshold=0"}])
def test_a_users_malloc_settings_are_left_as_they_are(monkeypatch, tmp_path, user):
    env = _env(monkeypatch, tmp_path, "cpu", **user)
    for key in _ALLOC_KEYS:
        assert env.get(key) == user.get(key)


def test_tunables_that_are_not_mallocs_do_not_count_as_a_choice():
    assert not user_set_allocator({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"})
    assert user_set_allocator({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2: glibc.malloc.perturb=0"})
    assert user_set_allocator(rank_environment())
