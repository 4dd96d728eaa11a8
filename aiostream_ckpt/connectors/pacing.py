"""Pacing: a source reader lets records out at a fixed rate of its clock.

Shared by the generator and the file source. A paced job lasts as long on any
machine (a fast one only idles more), so the checkpoints it takes along the
way, and what happens between them, do not depend on the machine's speed.
"""

from __future__ import annotations

from aiostream_ckpt.clock import Clock
from aiostream_ckpt.errors import ConfigError

#: Pacing never suspends longer than this, so a paced reader still answers soon.
MAX_PACING_SLEEP = 0.05


def check_rate(rate: float | None) -> float | None:
    """Return ``rate`` if it is None or positive; ConfigError otherwise."""
    if rate is not None and rate <= 0:
        raise ConfigError(f"rate must be positive, got {rate}")
    return rate


class Pacer:
    """At most ``rate`` records per second of ``clock``, counted from the first ask."""

    def __init__(self, rate: float, clock: Clock) -> None:
        self.rate = rate
        self._clock = clock
        self._since: float | None = None
        self._emitted = 0

    async def allowance(self, want: int) -> int:
        """How many of ``want`` records may go out now; may sleep a little, may be 0."""
        clock = self._clock
        if self._since is None:
            self._since = clock.monotonic()
        for _ in range(2):
            elapsed = clock.monotonic() - self._since
            allowed = int(elapsed * self.rate) - self._emitted
            if allowed >= 1:
                return min(want, allowed)
            wait = (self._emitted + 1) / self.rate - elapsed
            await clock.sleep(min(wait, MAX_PACING_SLEEP))
        return 0

    def emitted(self, n: int) -> None:
        """Count ``n`` records as let out."""
        self._emitted += n
