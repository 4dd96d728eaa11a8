"""StreamEnvironment: where an app builds its job."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from aiostream_ckpt.api.stream import Stream
from aiostream_ckpt.connectors.base import Source
from aiostream_ckpt.connectors.collection import CollectionSource, CollectSink
from aiostream_ckpt.errors import JobGraphError
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.jobspec.graph import (
    JobSpec,
    Partitioning,
    Transformation,
    TransformKind,
    UserFunction,
)
from aiostream_ckpt.jobspec.watermarks import WatermarkStrategy
from aiostream_ckpt.runtime.job import run_job

T = TypeVar("T")
_UID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")


class StreamEnvironment:
    """Collects the transformations of one job into a :class:`JobSpec`, and runs it.

    ``params`` are the app's own settings (the ``[app]`` table of the config,
    ``--set app.key=value``), like Flink's ParameterTool.
    """

    def __init__(
        self,
        job_name: str = "job",
        *,
        config: JobConfig | None = None,
        params: dict[str, Any] | None = None,
    ) -> None:
        self.job_name = job_name
        self.config = config if config is not None else JobConfig()
        self.params: dict[str, Any] = dict(params or {})
        self._transformations: list[Transformation] = []
        self._uids: set[str] = set()
        self._name_counts: dict[str, int] = {}

    @property
    def transformations(self) -> list[Transformation]:
        return list(self._transformations)

    def spec(self) -> JobSpec:
        """Freeze the job as built so far: the description the runtime runs.

        Building the same app again (in another process too) gives an equal
        description: the same uids, kinds and wiring in the same order.
        """
        return JobSpec(
            job_name=self.job_name,
            transformations=tuple(self._transformations),
            config=self.config,
            params=MappingProxyType(dict(self.params)),
        )

    def from_source(
        self,
        source: Source,
        *,
        uid: str | None = None,
        name: str | None = None,
        parallelism: int | None = None,
        watermark_strategy: WatermarkStrategy | None = None,
    ) -> Stream[Any]:
        """Start a stream at a replayable source.

        ``watermark_strategy`` turns on event time: timestamps and per-split
        watermarks (see :mod:`aiostream_ckpt.time`).
        """
        if watermark_strategy is not None:
            watermark_strategy.assigner()  # fail at build time, not in the job
        node = self._add_transformation(
            TransformKind.SOURCE,
            name or source.name,
            fn=source,
            uid=uid,
            parallelism=parallelism,
            inputs=[],
            watermark_strategy=watermark_strategy,
        )
        return Stream(self, node)

    def from_collection(self, items: Iterable[T], *, uid: str | None = None) -> Stream[T]:
        """Start a stream at a bounded in-memory collection (tests, examples)."""
        return self.from_source(CollectionSource(list(items)), uid=uid, parallelism=1)

    def _add_transformation(
        self,
        kind: TransformKind,
        name: str,
        *,
        fn: UserFunction = None,
        uid: str | None = None,
        parallelism: int | None = None,
        partitioning: Partitioning = Partitioning.FORWARD,
        key_selector: Callable[[Any], Any] | None = None,
        key_type: Any = None,
        inputs: list[Transformation],
        watermark_strategy: WatermarkStrategy | None = None,
        state_type: Any = None,
    ) -> Transformation:
        if uid is None:
            n = self._name_counts.get(name, 0) + 1
            self._name_counts[name] = n
            uid = name if n == 1 else f"{name}-{n}"
            while uid in self._uids:
                n += 1
                uid = f"{name}-{n}"
        if not _UID_RE.match(uid):
            raise JobGraphError(
                f"invalid uid {uid!r}: letters, digits, '_', '.', '-' only, at most 100 chars"
            )
        if uid in self._uids:
            raise JobGraphError(f"duplicate operator uid {uid!r}")
        p = parallelism if parallelism is not None else self.config.parallelism
        if p < 1 or p > self.config.max_parallelism:
            raise JobGraphError(
                f"operator {uid!r}: parallelism {p} outside 1..{self.config.max_parallelism}"
            )
        for inp in inputs:
            if inp.kind is TransformKind.SINK:
                raise JobGraphError(f"operator {uid!r} cannot read from sink {inp.uid!r}")
        node = Transformation(
            id=len(self._transformations),
            kind=kind,
            name=name,
            uid=uid,
            parallelism=p,
            inputs=tuple(inputs),
            fn=fn,
            partitioning=partitioning,
            key_selector=key_selector,
            key_type=key_type,
            watermark_strategy=watermark_strategy,
            state_type=state_type,
        )
        self._uids.add(uid)
        self._transformations.append(node)
        return node

    def execute(self) -> None:
        """Run the job to the end of its input (or until stopped), with recovery."""
        run_job(self.spec())

    def execute_and_collect(self, stream: Stream[Any]) -> list[Any]:
        """Run the job with an in-memory sink on ``stream`` and return what it emitted.

        Uses a temporary checkpoint directory; meant for tests and examples.
        """
        sink = CollectSink()
        stream.sink_to(sink, uid=f"collect-{len(self._transformations)}", parallelism=1)
        with tempfile.TemporaryDirectory(prefix="aiostream-collect-") as tmp:
            if self.config.checkpoint.directory is None:
                self.config = self.config.with_checkpoint_dir(Path(tmp) / "checkpoints")
            run_job(self.spec())
        return sink.results
