"""validate/backend.configure_cpu_heap: CPU workers keep the memory they free (mechanism 54).

What glibc does with a 1 MiB block is observable through mallinfo2(): ``hblks`` counts the
blocks it mapped one by one (malloc/malloc.c). With its defaults a 1 MiB block is mapped
(the mmap threshold starts at 128 KiB); with the heap kept it comes from the heap. The
checks run in fresh processes, since the setting lasts for the process that makes it.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

from costmodel.errors import InputError
from validate.backend import ENV_KEEP_HEAP, HEAP_MMAP_THRESHOLD_BYTES, configure_cpu_heap

ROOT = Path(__file__).resolve().parents[1]


def _glibc_with_mallinfo2() -> bool:
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version
        libc.mallinfo2
    except (OSError, AttributeError):
        return False
    return True


needs_glibc = pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="needs glibc >= 2.33 (mallinfo2)")


def mapped_blocks(size: int, count: int = 1) -> int:
    """How many of ``count`` fresh blocks of ``size`` bytes glibc maps one by one
    (mallinfo2().hblks before and after allocating them; freed again after)."""
    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = libc.mallinfo2().hblks
    ptrs = [libc.malloc(size) for _ in range(count)]
    mapped = libc.mallinfo2().hblks - before
    for p in ptrs:
        libc.free(p)
    return mapped


# In a fresh process: configure_cpu_heap() first when argv[1] == "keep" (the environment
# decides the rest), then how many of 4 blocks of argv[2] bytes are mapped one by one.
PROBE = r"""
import sys
sys.path[:0] = [sys.argv[3], sys.argv[4]]
if sys.argv[1] == "keep":
    from validate.backend import configure_cpu_heap
    print("set", configure_cpu_heap())
from test_cpu_heap import mapped_blocks
print("mapped", mapped_blocks(int(sys.argv[2]), 4))
"""


def _probe(mode: str, size: int, env_value: str | None = None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.pop(ENV_KEEP_HEAP, None)
    if env_value is not None:
        env[ENV_KEEP_HEAP] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE, mode, str(size), str(ROOT), str(ROOT / "tests")], env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.split()


@needs_glibc
def test_defaults_map_a_mebibyte_block_and_keeping_the_heap_does_not():
    """Four 1 MiB blocks: glibc's defaults map all four one by one (the 128 KiB threshold);
    after configure_cpu_heap none is (the threshold is 32 MiB); $PLANSIM_KEEP_HEAP=0 leaves
    the defaults (configure_cpu_heap returns False, all four mapped)."""
    assert _probe("plain", 1 << 20) == ["mapped", "4"]
    assert _probe("keep", 1 << 20) == ["set", "True", "mapped", "0"]
    assert _probe("keep", 1 << 20, "0") == ["set", "False", "mapped", "4"]


@needs_glibc
def test_blocks_beyond_the_threshold_are_still_mapped():
    """glibc refuses an mmap threshold above 32 MiB on 64-bit hosts, so a block of twice
    that is still mapped one by one with the heap kept: the setting is bounded, not a
    promise to keep everything."""
    assert _probe("keep", 2 * HEAP_MMAP_THRESHOLD_BYTES) == ["set", "True", "mapped", "4"]


def test_a_bad_setting_is_named(monkeypatch):
    """$PLANSIM_KEEP_HEAP takes 0 or 1; anything else is an InputError naming the variable."""
    monkeypatch.setenv(ENV_KEEP_HEAP, "yes")
    with pytest.raises(InputError) as e:
        configure_cpu_heap()
    assert e.value.source == ENV_KEEP_HEAP and "'yes'" in e.value.message


@needs_glibc
def test_launched_workers_keep_their_heap():
    """A worker started by validate/launch.launch has the heap kept: a 1 MiB block of its
    own comes from the heap (the wiring, not only the function)."""
    pytest.importorskip("torch")
    from validate.launch import launch
    assert launch(_mapped_blocks, 1, (1 << 20,), timeout_s=120, backend="gloo") == [0]


def _mapped_blocks(rank, world, size):
    return mapped_blocks(size)


@pytest.mark.parametrize("command", ["validate", "calibrate"])
@pytest.mark.parametrize("var,value", [(ENV_KEEP_HEAP, "yes"), ("PLANSIM_THREADS", "x")])
def test_a_bad_worker_setting_is_refused_before_any_worker_starts(capsys, monkeypatch, tmp_path, command, var, value):
    """The workers' settings are read by the process that starts them: `plansim validate`
    and `plansim calibrate` with a bad $PLANSIM_KEEP_HEAP or $PLANSIM_THREADS exit 2 with
    one line naming the variable and write nothing, where each worker used to fail as it
    joined (exit 1, 'rank 0: could not join the process group')."""
    pytest.importorskip("torch")
    from plansim.cli import main
    monkeypatch.setenv(var, value)
    out = tmp_path / "p.yaml"
    argv = (["validate", "localhost-cpu", "--model", "tiny", "--plan", "dp=2", "--steps", "1", "--warmup", "0"]
            if command == "validate" else ["calibrate", "localhost-cpu", "--world", "2", "--out", str(out)])
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and var in err and "rank" not in err, err
    assert list(tmp_path.iterdir()) == []
