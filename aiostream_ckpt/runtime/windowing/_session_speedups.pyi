"""C twins of :mod:`aiostream_ckpt.runtime.windowing.session_fold`'s loops (see there)."""

from collections.abc import Callable
from typing import Any

def fold(
    batch: list[Any],
    i: int,
    held: dict[Any, list[tuple[int, int, Any]]],
    key_selector: Callable[[Any], Any],
    timestamp: Callable[[Any], Any],
    add: Callable[[Any, Any], Any] | None,
    gap: int,
    after: int,
    added: list[Any],
    failed: list[int],
    /,
) -> int: ...
def rearm(
    run: list[tuple[int, Any]],
    i: int,
    armed: dict[Any, int],
    held: dict[Any, list[tuple[int, int, Any]]],
    buckets: dict[int, list[tuple[int, Any]]],
    watermark: int,
    bits: int,
    /,
) -> int: ...
