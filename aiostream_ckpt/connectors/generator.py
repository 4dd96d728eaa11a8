"""Deterministic, replayable page-view generator.

Event ``i`` of split ``s`` is a pure function of ``(seed, s, i)``, so a reader
restored at position ``i`` emits exactly what a failure-free run would have.
Events are generated a block at a time, each block from its own
``random.Random`` seeded by ``(seed, split, block)``: drawing a whole block
with ``Random.choices`` costs a fraction of per-event hashing, and a replay that
starts inside a block regenerates the block and skips its head.

Events look like ``{"app_id": "app-17", "user_id": "user-4711", "ts": <ms>,
"seq": n}`` (plus ``"pad"`` when ``event_size`` > 0). ``seq`` is unique over all
splits (``i * splits + s``); ``ts`` advances ``ts_step_ms`` per event of a split.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
from pathlib import Path
from typing import Any

from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.pacing import MAX_PACING_SLEEP, Pacer, check_rate, pause
from aiostream_ckpt.connectors.splits import assign_splits
from aiostream_ckpt.connectors.staging import serialize_lines
from aiostream_ckpt.errors import ConfigError

log = logging.getLogger(__name__)

Event = dict[str, Any]

#: Events per seeded block: large enough to amortise seeding, small enough that
#: a replay from inside a block wastes little.
BLOCK = 4096


class _EventModel:
    """Precomputed tables and the block function shared by source and file writer."""

    def __init__(
        self,
        *,
        seed: int,
        splits: int,
        keys: int,
        users: int,
        skew: float,
        event_size: int,
        base_ts_ms: int,
        ts_step_ms: int,
    ) -> None:
        if keys < 1 or users < 1 or splits < 1:
            raise ConfigError("keys, users and splits must be at least 1")
        if skew < 0 or event_size < 0:
            raise ConfigError("skew and event_size must not be negative")
        self.seed = seed
        self.splits = splits
        self.base_ts_ms = base_ts_ms
        self.ts_step_ms = ts_step_ms
        self.apps = [f"app-{k}" for k in range(keys)]
        self.users = [f"user-{u}" for u in range(users)]
        # Zipf-like: key of rank r has weight 1 / r**skew.
        self.cum_weights: list[float] | None = (
            list(itertools.accumulate(1.0 / (r**skew) for r in range(1, keys + 1)))
            if skew > 0
            else None
        )
        self.pad = "x" * event_size if event_size else None

    def block(self, split: int, index: int) -> list[Event]:
        """Block ``index`` of ``split``, always drawn whole.

        Draws are sequential (all app ids, then all user ids), so a shorter
        block would change its events: callers slice instead.
        """
        size = BLOCK
        rng = random.Random(f"{self.seed}/{split}/{index}")
        apps = rng.choices(self.apps, cum_weights=self.cum_weights, k=size)
        users = rng.choices(self.users, k=size)
        first = index * BLOCK
        n = self.splits
        seqs = range(first * n + split, (first + size) * n + split, n)
        step = self.ts_step_ms
        t0 = self.base_ts_ms + first * step
        ts = range(t0, t0 + size * step, step) if step else itertools.repeat(t0, size)
        pad = self.pad
        if pad is None:
            return [
                {"app_id": a, "user_id": u, "ts": t, "seq": q}
                for a, u, t, q in zip(apps, users, ts, seqs, strict=False)
            ]
        return [
            {"app_id": a, "user_id": u, "ts": t, "seq": q, "pad": pad}
            for a, u, t, q in zip(apps, users, ts, seqs, strict=False)
        ]


class GeneratorSource:
    """Seeded page-view events; bounded when ``count`` is given (total over splits).

    ``rate`` paces each split to that many events per second of ``ctx.clock``.
    Split ``s`` is read by subtask ``s % parallelism`` (in a sharded job,
    within its shard's block: :mod:`~aiostream_ckpt.connectors.splits`); give
    ``splits`` at least the parallelism or some readers have nothing to do.

    >>> import asyncio
    >>> from aiostream_ckpt.connectors.base import ConnectorContext
    >>> src = GeneratorSource(3, seed=7, keys=10)
    >>> r = src.create_reader(ConnectorContext("job", "gen", 0, 1))
    >>> asyncio.run(r.start(None))
    >>> [e["seq"] for e in asyncio.run(r.read_batch(10))]
    [0, 1, 2]
    >>> r.snapshot_position()
    {'split-0': 3}
    """

    def __init__(
        self,
        count: int | None,
        *,
        seed: int = 0,
        keys: int = 1000,
        users: int = 10_000,
        skew: float = 0.0,
        event_size: int = 0,
        name: str = "generator",
        splits: int = 1,
        rate: float | None = None,
        base_ts_ms: int = 1_700_000_000_000,
        ts_step_ms: int = 1,
    ) -> None:
        if count is not None and count < 0:
            raise ConfigError(f"count must not be negative, got {count}")
        self.name = name
        self.count = count
        self.bounded = count is not None
        #: fresh dicts of str and int per event (see ``Source``)
        self.json_exact = True
        self.splits = splits
        self.rate = check_rate(rate)
        self.model = _EventModel(
            seed=seed,
            splits=splits,
            keys=keys,
            users=users,
            skew=skew,
            event_size=event_size,
            base_ts_ms=base_ts_ms,
            ts_step_ms=ts_step_ms,
        )

    @staticmethod
    def split_id(split: int) -> str:
        return f"split-{split}"

    def split_length(self, split: int) -> int | None:
        """Events in ``split`` (None when unbounded): ``count`` spread evenly."""
        if self.count is None:
            return None
        q, r = divmod(self.count, self.splits)
        return q + (1 if split < r else 0)

    def generate(self, split: int, start: int, stop: int) -> list[Event]:
        """Events ``start`` .. ``stop - 1`` of ``split``; what a reader emits there."""
        out: list[Event] = []
        while start < stop:
            b, off = divmod(start, BLOCK)
            end = min(BLOCK, stop - b * BLOCK)
            out.extend(self.model.block(split, b)[off:end])
            start = b * BLOCK + end
        return out

    def create_reader(self, ctx: ConnectorContext) -> GeneratorReader:
        own = assign_splits(range(self.splits), ctx, source=f"generator {self.name!r}")
        return GeneratorReader(self, own, ctx)


class GeneratorReader:
    """Emits its splits' events, one split per call in turn."""

    def __init__(self, source: GeneratorSource, splits: list[int], ctx: ConnectorContext) -> None:
        self._src = source
        self._ctx = ctx
        self._positions = dict.fromkeys(splits, 0)
        self._active = list(splits)
        self._turn = 0
        #: Last generated block per split: (block index, events).
        self._cache: dict[int, tuple[int, list[Event]]] = {}
        rate = None if source.rate is None else source.rate * len(splits)
        self._pacer = None if rate is None else Pacer(rate, ctx.clock, ctx.wakeup)
        self._last_split = -1

    async def start(self, restored: dict[str, Any] | None) -> None:
        for s in self._positions:
            self._positions[s] = int((restored or {}).get(GeneratorSource.split_id(s), 0))
        self._active = [s for s in self._positions if self._remaining(s) != 0]

    def snapshot_position(self) -> dict[str, int]:
        return {GeneratorSource.split_id(s): p for s, p in self._positions.items()}

    def lag(self) -> dict[str, float]:
        """Events still to come per split (for metrics); none when unbounded."""
        if not self._src.bounded:
            return {}
        return {GeneratorSource.split_id(s): self._remaining(s) for s in self._positions}

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        return None

    async def close(self) -> None:
        self._cache.clear()

    def _remaining(self, split: int) -> float:
        length = self._src.split_length(split)
        return math.inf if length is None else max(0, length - self._positions[split])

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if not self._active:
            if self._src.bounded:
                return None
            # An unbounded reader without splits idles instead of ending the job's input.
            await pause(self._ctx.clock, MAX_PACING_SLEEP, self._ctx.wakeup)
            return []
        self._turn %= len(self._active)
        split = self._active[self._turn]
        self._turn += 1
        remaining = self._remaining(split)
        want = int(min(max_records, remaining))
        n = want if self._pacer is None else await self._pacer.allowance(want)
        if n <= 0:
            return []
        self._last_split = split
        events = self._take(split, n)
        if self._pacer is not None:
            self._pacer.emitted(len(events))
        if self._remaining(split) == 0:
            self._active.remove(split)
        return events

    async def read_split_batches(self, max_records: int) -> list[tuple[str, list[Any]]] | None:
        """Event time: each call reads one split; say which."""
        self._last_split = -1
        events = await self.read_batch(max_records)
        if events is None:
            return None
        if not events or self._last_split < 0:
            return []
        return [(GeneratorSource.split_id(self._last_split), events)]

    def active_splits(self) -> list[str]:
        return [GeneratorSource.split_id(s) for s in self._active]

    def _take(self, split: int, n: int) -> list[Event]:
        pos = self._positions[split]
        stop = pos + n
        out: list[Event] = []
        while pos < stop:
            b, off = divmod(pos, BLOCK)
            cached = self._cache.get(split)
            if cached is None or cached[0] != b:
                cached = (b, self._src.model.block(split, b))
                self._cache[split] = cached
            end = min(BLOCK, off + stop - pos)
            out.extend(cached[1][off:end])
            pos += end - off
        self._positions[split] = pos
        return out


def write_generated_jsonl(
    path: str | Path,
    count: int,
    seed: int = 0,
    keys: int = 1000,
    skew: float = 0.0,
    *,
    users: int = 10_000,
    event_size: int = 0,
    base_ts_ms: int = 1_700_000_000_000,
    ts_step_ms: int = 1,
) -> int:
    """Write the events of ``GeneratorSource(count, splits=1, ...)`` as JSON lines.

    Returns the number of bytes written.
    """
    model = _EventModel(
        seed=seed,
        splits=1,
        keys=keys,
        users=users,
        skew=skew,
        event_size=event_size,
        base_ts_ms=base_ts_ms,
        ts_step_ms=ts_step_ms,
    )
    written = 0
    with open(path, "wb") as f:
        for b in range(-(-count // BLOCK)):
            events = model.block(0, b)[: count - b * BLOCK]
            data = serialize_lines(events)
            f.write(data)
            written += len(data)
    log.info("wrote %d generated events (%d bytes) to %s", count, written, path)
    return written
