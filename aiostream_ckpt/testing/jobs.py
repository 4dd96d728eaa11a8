"""Run a whole job in-process and read what it committed, under injected failures.

The job runs on the real runtime: barrier checkpoints, two-phase-commit
sinks, the restart strategy and restore from the latest checkpoint. Outputs
are collected by exactly-once in-memory sinks, so what a test reads is what
was *committed*: a failure in the middle (a :class:`~aiostream_ckpt.testing.Fail`
marker in a :class:`~aiostream_ckpt.testing.ScriptedSource`, or an exception in
user code) must leave the same outputs as a run without it.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiostream_ckpt.api.environment import StreamEnvironment
from aiostream_ckpt.api.stream import Stream
from aiostream_ckpt.clock import Clock
from aiostream_ckpt.connectors.collection import CollectSink
from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt.jobspec.config import RestartConfig, RestartStrategyKind
from aiostream_ckpt.runtime.job import JobRunner
from aiostream_ckpt.testing.scripted import ScriptedSource


@dataclass(frozen=True)
class JobOutputs(Mapping[str, list[Any]]):
    """Committed records per output name, and how many restarts the run took."""

    results: dict[str, list[Any]]
    restarts: int
    last_checkpoint: int | None

    def __getitem__(self, name: str) -> list[Any]:
        return self.results[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)


class CollectingSinks:
    """One exactly-once collecting sink per named output (main or side outputs).

    >>> from aiostream_ckpt.api import StreamEnvironment
    >>> env = StreamEnvironment("evens")
    >>> numbers = env.from_collection([1, 2, 3, 4])
    >>> sinks = CollectingSinks()
    >>> sinks.attach("evens", numbers.filter(lambda n: n % 2 == 0))
    >>> sinks.attach("odds", numbers.filter(lambda n: n % 2 == 1))
    >>> sorted(sinks.names())
    ['evens', 'odds']
    """

    def __init__(self) -> None:
        self._sinks: dict[str, CollectSink] = {}

    def attach(self, name: str, stream: Stream[Any]) -> None:
        """Collect ``stream`` (e.g. ``windowed.get_side_output(tag)``) as output ``name``."""
        if name in self._sinks:
            raise ValueError(f"output {name!r} is collected twice")
        sink = self._sinks[name] = CollectSink(name=f"collect-{name}")
        stream.sink_to(sink, uid=f"testing-collect-{name}", parallelism=1)

    def names(self) -> list[str]:
        return list(self._sinks)

    def results(self) -> dict[str, list[Any]]:
        """Return what each sink committed so far (all of it once the job finished)."""
        return {name: list(sink.results) for name, sink in self._sinks.items()}


def _test_config(
    env: StreamEnvironment, restarts: int, interval: float | None, directory: Path
) -> None:
    config = env.config
    if config.checkpoint.directory is None:
        config = config.with_checkpoint_dir(directory / "checkpoints")
    if interval is not None:
        config = dataclasses.replace(
            config, checkpoint=dataclasses.replace(config.checkpoint, interval=interval)
        )
    if config.checkpoint.interval == 0:
        for node in env.transformations:
            if isinstance(node.fn, ScriptedSource) and node.fn.waits_for_checkpoints:
                raise ConfigError(
                    f"source {node.uid!r} waits at a Checkpoint marker but periodic "
                    "checkpoints are off: pass checkpoint_interval=... (seconds)"
                )
    restart = RestartConfig(strategy=RestartStrategyKind.FIXED_DELAY, attempts=restarts, delay=0.0)
    env.config = dataclasses.replace(config, restart=restart)


def run_job(
    env: StreamEnvironment,
    outputs: Mapping[str, Stream[Any]],
    *,
    restarts: int = 3,
    checkpoint_interval: float | None = None,
    clock: Clock | None = None,
) -> JobOutputs:
    """Run ``env``'s job to the end and return what each of ``outputs`` committed.

    Blocking (runs its own event loop; from async tests use :func:`run_job_async`).
    The job restarts without delay up to ``restarts`` times, each time from its
    latest completed checkpoint; more failures fail the call with the job's
    error. Without ``checkpoint.dir`` in the job's config, checkpoints go to a
    temporary directory removed afterwards. ``checkpoint_interval`` (seconds)
    replaces the config's ``checkpoint.interval``; the env's config is changed
    in place (restart strategy, directory), so build a fresh env per run.
    """
    import uvloop

    result: JobOutputs = uvloop.run(
        run_job_async(
            env, outputs, restarts=restarts, checkpoint_interval=checkpoint_interval, clock=clock
        )
    )
    return result


async def run_job_async(
    env: StreamEnvironment,
    outputs: Mapping[str, Stream[Any]],
    *,
    restarts: int = 3,
    checkpoint_interval: float | None = None,
    clock: Clock | None = None,
) -> JobOutputs:
    """:func:`run_job` on the running event loop."""
    sinks = CollectingSinks()
    for name, stream in outputs.items():
        sinks.attach(name, stream)
    with tempfile.TemporaryDirectory(prefix="aiostream-testing-") as tmp:
        _test_config(env, restarts, checkpoint_interval, Path(tmp))
        result = await JobRunner(env.spec(), clock=clock).run()
    return JobOutputs(sinks.results(), result.restarts, result.last_checkpoint)
