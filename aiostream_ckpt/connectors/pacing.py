"""Pacing: a source reader lets records out at a fixed rate of its clock.

Shared by the generator and the file source. A paced job lasts as long on any
machine (a fast one only idles more), so the checkpoints it takes along the
way, and what happens between them, do not depend on the machine's speed.

Records go out in slices of :data:`MIN_PACING_SLICE` of the rate (or all that
was asked for), never one at a time: under uvloop a sleep shorter than a
millisecond returns at once, so a reader that waited for its next record
(0.2 ms at 5,000/s) spun the event loop, and each batch of one record paid
the task loop's turn. The soak's pv_count at 5,000 events/s took 76 % of a
core that way.

A sleep longer than a slice ends early when the task's ``wakeup`` is set (a
barrier to inject): else a barrier waited for it (at 10 events/s checkpoints
took 54 ms median, 10 ms since). Shorter sleeps are not worth a task each.
"""

from __future__ import annotations

from aiostream_ckpt.aio import Wakeup
from aiostream_ckpt.clock import MIN_SLEEP, Clock
from aiostream_ckpt.errors import ConfigError

#: Pacing never suspends longer than this, so a paced reader still answers soon.
MAX_PACING_SLEEP = 0.05
#: Seconds of the rate a paced reader waits for before letting records out (when asked for
#: that many): a few ms of latency, against a task-loop turn per record.
MIN_PACING_SLICE = 0.005
#: Shortest sleep: the clock's floor (:data:`~aiostream_ckpt.clock.MIN_SLEEP`), applied here
#: too so that a reader on any clock (tests inject their own) waits whole milliseconds.
MIN_PACING_SLEEP = MIN_SLEEP


def check_rate(rate: float | None) -> float | None:
    """Return ``rate`` if it is None or positive; ConfigError otherwise."""
    if rate is not None and rate <= 0:
        raise ConfigError(f"rate must be positive, got {rate}")
    return rate


async def pause(clock: Clock, seconds: float, wakeup: Wakeup | None) -> None:
    """Sleep ``seconds`` of ``clock``, less if ``wakeup`` is set (at once if it is already)."""
    if wakeup is None or seconds <= MIN_PACING_SLICE:
        await clock.sleep(seconds)
    else:
        await wakeup.sleep(clock.sleep(seconds))


class Pacer:
    """At most ``rate`` records per second of ``clock``, counted from the first ask.

    ``wakeup`` (the reader's ``ConnectorContext.wakeup``): set, it ends a wait early.
    """

    def __init__(self, rate: float, clock: Clock, wakeup: Wakeup | None = None) -> None:
        self.rate = rate
        self._clock = clock
        self._wakeup = wakeup
        self._since: float | None = None
        self._emitted = 0

    async def allowance(self, want: int) -> int:
        """How many of ``want`` records may go out now; may sleep a little, may be 0.

        Waits for a slice's worth (:data:`MIN_PACING_SLICE`, at most ``want``)
        to be due, sleeping at least :data:`MIN_PACING_SLEEP` and at most
        :data:`MAX_PACING_SLEEP` at a time; after two sleeps, or once the
        wakeup is set, it lets out what is due, if any.
        """
        clock, wakeup = self._clock, self._wakeup
        if self._since is None:
            self._since = clock.monotonic()
        need = max(1, min(want, int(self.rate * MIN_PACING_SLICE)))
        for _ in range(2):
            elapsed = clock.monotonic() - self._since
            allowed = int(elapsed * self.rate) - self._emitted
            if allowed >= need:
                return min(want, allowed)
            if wakeup is not None and wakeup.is_set():
                break  # the task has a barrier to inject first
            wait = (self._emitted + need) / self.rate - elapsed
            await pause(clock, min(max(wait, MIN_PACING_SLEEP), MAX_PACING_SLEEP), wakeup)
        allowed = int((clock.monotonic() - self._since) * self.rate) - self._emitted
        return max(0, min(want, allowed))

    def emitted(self, n: int) -> None:
        """Count ``n`` records as let out."""
        self._emitted += n
