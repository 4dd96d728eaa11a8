"""The process profile: GC, malloc and GIL knobs every job process runs with.

The job runner applies it once per process, whatever started the job (the CLI,
the daemon, ``env.execute()``, the testing kit), and so does each worker process
(``daemon/worker.py``), so a job run from a script behaves like the benchmarked
one. What each knob buys, with the measured figures: ``docs/performance.md``.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: ``mallopt`` parameter number in glibc's malloc.h
_M_TRIM_THRESHOLD = -1


@dataclass(frozen=True)
class ProcessProfile:
    """The ``process.*`` config keys (see ``docs/performance.md``)."""

    #: allocations between young-generation GC passes (Python's default is 700)
    gc_threshold: int = 50_000
    #: glibc keeps this much free memory at the top of the heap (0: its default, 128 KiB)
    malloc_trim_threshold: int = 128 << 20
    #: seconds a thread waits for the GIL before it asks for it (Python's default 0.005)
    switch_interval: float = 0.0005


_lock = threading.Lock()
_applied: ProcessProfile | None = None


def apply_process_profile(profile: ProcessProfile) -> bool:
    """Apply ``profile`` to this process unless one already was; return whether it was now.

    Once per process: :func:`gc.freeze` is meant for what startup allocated,
    and a second job in the same process keeps the first one's profile (a
    different one is logged, not applied).
    """
    global _applied
    with _lock:
        if _applied is not None:
            if profile != _applied:
                log.warning(
                    "process profile already set to %s; keeping it, not %s", _applied, profile
                )
            return False
        tune_gc(profile.gc_threshold)
        tune_malloc(profile.malloc_trim_threshold)
        tune_switch_interval(profile.switch_interval)
        _applied = profile
        return True


def tune_malloc(trim_threshold: int, env: Mapping[str, str] = os.environ) -> bool:
    """Let glibc keep ``trim_threshold`` bytes of freed heap instead of returning it at once.

    Same as setting ``MALLOC_TRIM_THRESHOLD_``, which, when set, wins. Returns
    whether it was applied (not on a libc without ``mallopt``, e.g. musl).
    Why: ``docs/performance.md``.
    """
    if trim_threshold <= 0 or "MALLOC_TRIM_THRESHOLD_" in env:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # no such libc call; Windows: no CDLL(None)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_TRIM_THRESHOLD, min(trim_threshold, 2**31 - 1)))


def tune_switch_interval(seconds: float) -> None:
    """Hand the GIL to a waiting thread after ``seconds`` instead of Python's 5 ms.

    The snapshot writer and the sink's commit are threads whose every file call
    gives the GIL up. Why and the figures: ``docs/performance.md``.
    """
    sys.setswitchinterval(seconds)


def tune_gc(gen0_threshold: int) -> None:
    """Set the young-generation GC threshold and freeze what startup allocated.

    :func:`gc.freeze` keeps the modules and the job graph out of the
    old-generation passes for good. Why and the figures: ``docs/performance.md``.
    """
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)
    gc.freeze()
