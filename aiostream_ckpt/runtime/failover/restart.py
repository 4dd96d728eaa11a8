"""Restart strategies, as in Flink: fixed delay, exponential delay, failure rate.

A strategy answers one question after each failure: wait how long before the
next attempt, or give up. Errors that a restart cannot fix (a bad config, an
app that does not import, state that does not match the job) are never
retried.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque

from aiostream_ckpt.clock import Clock
from aiostream_ckpt.errors import (
    AppLoadError,
    ConfigError,
    ConnectorError,
    FencedError,
    JobGraphError,
    PartitioningError,
    RecordError,
    StateMigrationError,
)
from aiostream_ckpt.jobspec.config import RestartConfig, RestartStrategyKind

NOT_RESTARTABLE: tuple[type[BaseException], ...] = (
    ConfigError,
    AppLoadError,
    JobGraphError,
    StateMigrationError,
    PartitioningError,  # input declared partitioned by key is not: the same records again
    RecordError,  # fail-fast on a malformed record: a restart reads the same record again
    FencedError,  # another daemon owns the checkpoints now: a restart would take them back
)


def restartable(failure: BaseException) -> bool:
    """Whether a restart can help: not for bad config/apps/state, nor a connector that says so."""
    if isinstance(failure, NOT_RESTARTABLE):
        return False
    return not (isinstance(failure, ConnectorError) and not failure.retriable)


class RestartStrategy(ABC):
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.restarts = 0

    def next_delay(self, failure: BaseException) -> float | None:
        """Seconds to wait before restarting, or ``None`` to fail the job."""
        if not restartable(failure):
            return None
        delay = self._next_delay()
        if delay is not None:
            self.restarts += 1
        return delay

    @abstractmethod
    def _next_delay(self) -> float | None: ...

    @abstractmethod
    def describe(self) -> str:
        """Why this strategy gives up, in the config keys a user would change."""

    def give_up_reason(self, failure: BaseException) -> str:
        """Why ``failure`` ends the job: the strategy gave up, or a restart cannot help."""
        if not restartable(failure):
            return f"not restarted: {type(failure).__name__} is not retriable"
        return self.describe()


class NoRestart(RestartStrategy):
    def _next_delay(self) -> float | None:
        return None

    def describe(self) -> str:
        return "restart.strategy=none"


class FixedDelayRestart(RestartStrategy):
    def __init__(self, clock: Clock, attempts: int, delay: float) -> None:
        super().__init__(clock)
        self.attempts = attempts
        self.delay = delay

    def _next_delay(self) -> float | None:
        return self.delay if self.restarts < self.attempts else None

    def describe(self) -> str:
        return f"restart.strategy=fixed_delay exhausted its restart.attempts={self.attempts}"


class ExponentialDelayRestart(RestartStrategy):
    """Delay doubles (``multiplier``) up to ``max_delay``; resets after a quiet period."""

    def __init__(
        self,
        clock: Clock,
        attempts: int,
        initial: float,
        max_delay: float,
        multiplier: float,
        reset_after: float,
    ) -> None:
        super().__init__(clock)
        self.attempts = attempts
        self.initial = initial
        self.max_delay = max_delay
        self.multiplier = multiplier
        self.reset_after = reset_after
        self._current = initial
        self._last_failure: float | None = None
        self._in_streak = 0

    def _next_delay(self) -> float | None:
        now = self._clock.monotonic()
        if self._last_failure is not None and now - self._last_failure > self.reset_after:
            self._current = self.initial
            self._in_streak = 0
        self._last_failure = now
        if self._in_streak >= self.attempts:
            return None
        delay = self._current
        self._current = min(self.max_delay, self._current * self.multiplier)
        self._in_streak += 1
        return delay

    def describe(self) -> str:
        return (
            f"restart.strategy=exponential_delay exhausted its restart.attempts={self.attempts} "
            f"(within restart.reset_after={self.reset_after}s)"
        )


class FailureRateRestart(RestartStrategy):
    """Give up when more than ``max_failures`` happen within ``interval`` seconds."""

    def __init__(self, clock: Clock, max_failures: int, interval: float, delay: float) -> None:
        super().__init__(clock)
        self.max_failures = max_failures
        self.interval = interval
        self.delay = delay
        self._failures: deque[float] = deque()

    def _next_delay(self) -> float | None:
        now = self._clock.monotonic()
        self._failures.append(now)
        while self._failures and now - self._failures[0] > self.interval:
            self._failures.popleft()
        return self.delay if len(self._failures) <= self.max_failures else None

    def describe(self) -> str:
        return (
            f"restart.strategy=failure_rate allows restart.attempts={self.max_failures} "
            f"failures per restart.failure_rate_interval={self.interval}s"
        )


def restart_strategy(config: RestartConfig, clock: Clock) -> RestartStrategy:
    kind = config.strategy
    if kind is RestartStrategyKind.NONE:
        return NoRestart(clock)
    if kind is RestartStrategyKind.FIXED_DELAY:
        return FixedDelayRestart(clock, config.attempts, config.delay)
    if kind is RestartStrategyKind.EXPONENTIAL_DELAY:
        return ExponentialDelayRestart(
            clock,
            config.attempts,
            config.delay,
            config.max_delay,
            config.backoff_multiplier,
            config.reset_after,
        )
    return FailureRateRestart(clock, config.attempts, config.failure_rate_interval, config.delay)
