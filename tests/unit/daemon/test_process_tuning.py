"""Process tuning: keep freed heap (malloc trim threshold), hand the GIL over sooner."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from aiostream_ckpt.daemon.config import load_config
from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt.runtime.process import tune_malloc, tune_switch_interval

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

#: Grows the heap by ~20 MB of malloc'd (not mmap'd) blocks, frees them and
#: prints how far the program break came back down.
_PROBE = """
import ctypes, sys
from aiostream_ckpt.runtime.process import tune_malloc, tune_switch_interval
print(tune_malloc(int(sys.argv[1])), file=sys.stderr)
libc = ctypes.CDLL(None)
libc.sbrk.restype = ctypes.c_void_p
libc.sbrk.argtypes = (ctypes.c_ssize_t,)
blocks = [bytearray(100_000) for _ in range(200)]  # under the 128 KiB mmap threshold
top = libc.sbrk(0)
del blocks
print(top - libc.sbrk(0))
"""


def _heap_returned(threshold: int, env: dict[str, str] | None = None) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(threshold)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return int(done.stdout), done.stderr.strip()


@glibc
def test_threshold_keeps_freed_heap() -> None:
    base = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    returned, applied = _heap_returned(0, base)  # glibc's default: trims right away
    assert applied == "False"
    assert returned > 10_000_000
    returned, applied = _heap_returned(128 << 20, base)
    assert applied == "True"
    assert returned == 0
    # the environment variable is glibc's own switch and wins over the setting
    returned, applied = _heap_returned(128 << 20, {**base, "MALLOC_TRIM_THRESHOLD_": "131072"})
    assert applied == "False"
    assert returned > 10_000_000


def test_setting_parses_and_refuses_garbage() -> None:
    assert load_config(None, env={}).daemon.malloc_trim_threshold == 128 << 20
    env = {"AIOSTREAM_PROCESS__MALLOC_TRIM_THRESHOLD": "0"}
    assert load_config(None, env=env).daemon.malloc_trim_threshold == 0
    assert tune_malloc(0) is False
    with pytest.raises(ConfigError, match=r"process\.malloc_trim_threshold='lots'"):
        load_config(None, env={}, sets=["process.malloc_trim_threshold=lots"])


def test_switch_interval_setting_applies_and_refuses_garbage() -> None:
    assert load_config(None, env={}).daemon.switch_interval == 0.0005
    env = {"AIOSTREAM_PROCESS__SWITCH_INTERVAL": "0.002"}
    assert load_config(None, env=env).daemon.switch_interval == 0.002
    for bad in ("0", "-1", "soon", "5"):
        with pytest.raises(ConfigError, match=r"process\.switch_interval="):
            load_config(None, env={}, sets=[f"process.switch_interval={bad}"])
    before = sys.getswitchinterval()
    try:
        tune_switch_interval(0.002)
        assert sys.getswitchinterval() == pytest.approx(0.002)
    finally:
        sys.setswitchinterval(before)
