"""The Kafka path: one broker per bench run, one input topic, a fresh output topic per run.

The bench starts one real broker (:class:`KafkaBroker`, KRaft, loopback) for
the whole Kafka path, creates the input topic (4 partitions) and loads the
seeded events into it once (the same JSONL as the embedded path), then runs
each system on it with a fresh output topic per run:

* ``aiostream-ckpt``: ``apps.pv_count`` in Kafka mode (KafkaSource ->
  keyed count -> two-phase-commit KafkaSink), exactly-once, 1 s checkpoints;
* ``bare-aiokafka``: ``bench/peers/bare_aiokafka.py``, the ceiling;
* ``quixstreams``: ``bench/peers/quix_pv_count.py`` in its own venv;
* ``faust``: ``bench/peers/faust_pv_count.py`` in its own venv.

Throughput is measured from outside and alike for all: the bench samples the
output topic's end offsets (high watermark, summed over its partitions, one
ListOffsets request on a raw socket every 100 ms). Every system writes one
update per input event, so that sum is its progress in events; the rate
over the steady window (10 % .. 90 % of the events) is the figure. The high
watermark counts records of open transactions too, so it moves as the
records are written, not in 1 s steps at commits.

Exactly-once: after each run the output topic is read ``read_committed`` and
recounted against the input (:func:`aiostream_ckpt_dev.recount.check_pv_updates`:
each key's committed updates are exactly 1..n in order); in full mode (or
``--validator spark``) the project's Spark validator reads every output topic
too, in one session, after all timed runs and before the broker stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from aiostream_ckpt_dev.broker.process import recv_exactly
from bench import runner
from bench.monitor import ProcessRecord, run_monitored, wait_for_quiet
from bench.results import RunResult, unavailable
from bench.runner import Measured, describe_median, say, summarize_repeats, validate_with_spark
from bench.stats import steady_window
from bench.systems import (
    PEERS_DIR,
    REPO,
    Attempt,
    Ours,
    Workload,
    _CheckpointPoller,
    _PeerSystem,
    completed_from_lines,
    ours_env_cwd,
)
from bench.validation import Verdict

#: Every system that runs on the Kafka path, ours first.
KAFKA_SYSTEMS = ("aiostream-ckpt", "bare-aiokafka", "quixstreams", "faust")
#: Systems that run on the Kafka path only.
KAFKA_ONLY = KAFKA_SYSTEMS[1:]
#: Partitions of the input and of every output topic.
PARTITIONS = 4
#: Seconds between two samples of the output topic's end offsets.
SAMPLE_EVERY_S = 0.1


# -- which paths a bench run covers ------------------------------------------------------


def select_paths(
    path: str | None, *, full: bool, systems: Sequence[str], explicit: bool
) -> tuple[bool, bool]:
    """(embedded, kafka): which paths to run.

    ``--path`` decides when given. Otherwise full mode runs both, quick mode
    only the embedded path, and a ``--systems`` list naming a Kafka-only
    system (bare-aiokafka, quixstreams, faust) adds the Kafka path; if it
    names no embedded-only system either, the embedded path is skipped.

    >>> select_paths(None, full=False, systems=["aiostream-ckpt", "bare-loop"], explicit=False)
    (True, False)
    >>> select_paths(None, full=False, systems=["aiostream-ckpt", "faust"], explicit=True)
    (False, True)
    >>> select_paths(None, full=True, systems=["aiostream-ckpt"], explicit=True)
    (True, True)
    """
    if path is not None:
        return path in ("embedded", "both"), path in ("kafka", "both")
    names_kafka_only = explicit and any(s in KAFKA_ONLY for s in systems)
    names_embedded_only = any(s not in KAFKA_SYSTEMS for s in systems)
    kafka = full or names_kafka_only
    embedded = names_embedded_only or not names_kafka_only
    return embedded, kafka


def not_run(systems: Iterable[str], reason: str) -> list[RunResult]:
    """``unavailable`` results for Kafka systems when the Kafka path was not selected."""
    return [unavailable(s, "kafka", reason) for s in systems if s in KAFKA_SYSTEMS]


# -- the output topic's end offsets, from outside -----------------------------------------


def encode_list_offsets(
    topic: str, partitions: Sequence[int], correlation_id: int, client_id: bytes = b"bench"
) -> bytes:
    """A framed ListOffsets v2 request for the latest offsets (read_uncommitted: high watermark).

    >>> encode_list_offsets("t", [0], 7)[:4] == struct.pack(">i", 43)
    True
    """
    header = struct.pack(">hhih", 2, 2, correlation_id, len(client_id)) + client_id
    name = topic.encode()
    body = struct.pack(">ib", -1, 0) + struct.pack(">ih", 1, len(name)) + name
    body += struct.pack(">i", len(partitions))
    for p in partitions:
        body += struct.pack(">iq", p, -1)
    msg = header + body
    return struct.pack(">i", len(msg)) + msg


def decode_list_offsets(body: bytes, correlation_id: int) -> dict[int, int]:
    """``{partition: offset}`` from a ListOffsets v2 response body (after the size prefix)."""
    cid, _throttle, n_topics = struct.unpack_from(">iii", body, 0)
    if cid != correlation_id:
        raise OSError(f"ListOffsets: correlation id {cid}, expected {correlation_id}")
    pos = 12
    out: dict[int, int] = {}
    for _ in range(n_topics):
        (name_len,) = struct.unpack_from(">h", body, pos)
        pos += 2 + name_len
        (n_parts,) = struct.unpack_from(">i", body, pos)
        pos += 4
        for _ in range(n_parts):
            part, err, _ts, offset = struct.unpack_from(">ihqq", body, pos)
            pos += 22
            if err != 0:
                raise OSError(f"ListOffsets: partition {part} error code {err}")
            out[part] = offset
    return out


class EndOffsetSampler:
    """Sum of a topic's end offsets, sampled into ``samples`` as (seconds since start, records).

    Called by :func:`bench.monitor.run_monitored` every 50 ms with the time
    since the worker started; asks the broker every :data:`SAMPLE_EVERY_S`.
    A sample that fails (broker busy, socket closed) is skipped.
    """

    def __init__(self, host: str, port: int, topic: str, partitions: int) -> None:
        self.addr = (host, port)
        self.topic = topic
        self.partitions = list(range(partitions))
        self.samples: list[tuple[float, float]] = [(0.0, 0.0)]
        self._sock: socket.socket | None = None
        self._cid = 0
        self._last = -1.0

    def read(self) -> int:
        if self._sock is None:
            self._sock = socket.create_connection(self.addr, timeout=2.0)
        self._cid = (self._cid + 1) & 0x7FFFFFFF
        self._sock.sendall(encode_list_offsets(self.topic, self.partitions, self._cid))
        (size,) = struct.unpack(">i", recv_exactly(self._sock, 4))
        offsets = decode_list_offsets(recv_exactly(self._sock, size), self._cid)
        return sum(offsets.values())

    def __call__(self, now: float) -> None:
        if now - self._last >= SAMPLE_EVERY_S:
            self.sample_at(now)

    def sample_at(self, now: float) -> None:
        self._last = now
        try:
            value = float(self.read())
        except (OSError, struct.error):
            self.close()
            return
        self.samples.append((now, max(value, self.samples[-1][1])))

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None


# -- exactly-once: read_committed recount ---------------------------------------------------


def recount_values(values: Iterable[bytes], expected: Any, malformed: int = 0) -> Verdict:
    """The read_committed output values checked with the project's recount, as a bench Verdict.

    >>> import collections
    >>> v = recount_values([b'{"app_id":"a","pv":1}', b'{"app_id":"a","pv":1}'],
    ...                    collections.Counter({"a": 1}))
    >>> v.passed, v.counts["records_out"]
    (False, 2)
    """
    from aiostream_ckpt_dev.recount import check_pv_updates

    records: list[dict[str, Any]] = []
    bad = 0
    for raw in values:
        try:
            rec = orjson.loads(raw)
        except orjson.JSONDecodeError:
            bad += 1
            continue
        if isinstance(rec, dict) and "app_id" in rec and "pv" in rec:
            records.append(rec)
        else:
            bad += 1
    v = check_pv_updates(records, expected, malformed=malformed, label="read_committed recount")
    counts = {
        "records_out": v.records + bad,
        "events_in": v.events,
        "keys": v.keys,
        "problems": len(v.problems),
        "malformed_out": bad,
    }
    passed = v.passed and bad == 0
    if passed:
        summary = "exactly-once"
    else:
        first = "; ".join(v.problems[:3])
        summary = f"{v.summary}" + (f", {bad} malformed records" if bad else "")
        summary += f" ({first})" if first else ""
    return Verdict("python", passed, counts, summary)


def _recount_main(argv: Sequence[str]) -> None:
    """Child-process entry: read one output topic read_committed, recount, print the verdict."""
    from aiostream_ckpt_dev.demo.kafka import read_topic_values
    from aiostream_ckpt_dev.recount import recount_inputs

    bootstrap, topic, input_path = argv
    expected, malformed = recount_inputs([Path(input_path)])
    values = asyncio.run(read_topic_values(bootstrap, topic))
    v = recount_values(values, expected, malformed)
    print("BENCH-RECOUNT " + json.dumps(v.to_json()), flush=True)


def recount_topic(bootstrap: str, topic: str, input_path: Path) -> Verdict:
    """:func:`recount_values` over the whole output topic, in a child process.

    A child, so the million values never enter the bench process: a worker
    forked from a big parent inherits its RSS as the start of ``ru_maxrss``.
    ``passed`` is None (unchecked, not refused) when the recount itself fails.
    """
    code = "import sys; from bench.kafka import _recount_main; _recount_main(sys.argv[1:])"
    try:
        r = subprocess.run(
            [sys.executable, "-c", code, bootstrap, topic, str(input_path)],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=600,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Verdict("python", None, {}, "read_committed recount timed out after 600s")
    for line in r.stdout.splitlines():
        if line.startswith("BENCH-RECOUNT "):
            d = json.loads(line[len("BENCH-RECOUNT ") :])
            return Verdict("python", d["passed"], d["counts"], d["summary"])
    tail = " | ".join(r.stderr.strip().splitlines()[-3:])[-400:]
    return Verdict(
        "python", None, {}, f"read_committed recount failed (exit {r.returncode}): {tail}"
    )


def overall_verdict(passed: Sequence[bool | None]) -> bool | None:
    """False if any run's output failed the check, None if any went unchecked, else True.

    >>> overall_verdict([True, True]), overall_verdict([True, None]), overall_verdict([None, False])
    (True, None, False)
    """
    if any(p is False for p in passed):
        return False
    if any(p is None for p in passed):
        return None
    return True


# -- the topic workload --------------------------------------------------------------------


@dataclass
class KafkaWorkload:
    """The broker, the loaded input topic, and the JSONL it was loaded from."""

    bootstrap: str
    input_topic: str
    partitions: int
    source: Workload
    load_s: float = 0.0

    @property
    def events(self) -> int:
        return self.source.events

    @property
    def host_port(self) -> tuple[str, int]:
        host, port = self.bootstrap.rsplit(":", 1)
        return host, int(port)

    def describe(self) -> dict[str, Any]:
        return {
            **self.source.describe(),
            "input_topic": self.input_topic,
            "partitions": self.partitions,
            "load_s": round(self.load_s, 2),
        }


@dataclass
class KafkaSpec:
    workload: KafkaWorkload
    run_dir: Path
    output_topic: str
    interval_s: float = 1.0
    mode: str = "exactly_once"
    sets: list[str] = field(default_factory=list)
    timeout: float = 600.0


class KafkaSystem(ABC):
    name = ""
    path = "kafka"

    def unavailable_reason(self) -> str | None:
        return None

    def version(self) -> str | None:
        return None

    @abstractmethod
    def run(self, spec: KafkaSpec, sampler: EndOffsetSampler) -> Attempt:
        """Run the system once on ``spec`` and report what was measured."""


class OursKafka(KafkaSystem):
    """``aiostream-ckpt run apps.pv_count`` in Kafka mode, bounded by the input's end offsets."""

    name = "aiostream-ckpt"

    def version(self) -> str | None:
        return Ours().version()

    def command(self, spec: KafkaSpec, ckpt_dir: Path) -> list[str]:
        from aiostream_ckpt_dev.demo.kafka import worker_flags

        wl = spec.workload
        sets = [
            f"job.name=bench-{spec.output_topic}",
            f"checkpoint.dir={ckpt_dir}",
            f"checkpoint.interval={spec.interval_s}",
            f"checkpoint.mode={spec.mode}",
            "job.parallelism=1",
            f"app.kafka_bootstrap={wl.bootstrap}",
            f"app.input_topic={wl.input_topic}",
            f"app.output_topic={spec.output_topic}",
            "app.stop_at_end=1",
            *spec.sets,
        ]
        cmd = [sys.executable, "-m", "aiostream_ckpt.daemon.cli", "run", "apps.pv_count"]
        for s in sets:
            cmd += ["--set", s]
        flags = worker_flags() or ["--set", "rest.enabled=false"]
        return cmd + flags

    def run(self, spec: KafkaSpec, sampler: EndOffsetSampler) -> Attempt:
        ckpt_dir = spec.run_dir / "ckpt"
        poller = _CheckpointPoller(ckpt_dir)

        def on_sample(now: float) -> None:
            sampler(now)
            poller(now)

        env, cwd = ours_env_cwd()
        rec = run_monitored(
            self.command(spec, ckpt_dir),
            cwd=cwd,
            env=env,
            timeout=spec.timeout,
            log_path=spec.run_dir / "worker.log",
            on_sample=on_sample,
        )
        poller(0.0)
        return Attempt(
            rec,
            spec.run_dir,
            {
                "app": "apps.pv_count (Kafka mode, stop_at_end=1)",
                "parallelism": 1,
                "checkpoint_interval_s": spec.interval_s,
                "mode": spec.mode,
                "rest": "disabled",
            },
            f"checkpoints every {spec.interval_s:g}s, {spec.mode}, LMDB state; KafkaSource "
            "offsets in the checkpoint; two-phase-commit KafkaSink (one transaction per "
            "checkpoint, committed when it completes)",
            poller.seen,
            completed_from_lines(rec.lines),
        )


class BareAiokafka(KafkaSystem):
    """The ceiling: consume -> dict count -> transactional produce, offsets in the transaction."""

    name = "bare-aiokafka"

    def version(self) -> str | None:
        from importlib.metadata import version

        return f"aiokafka {version('aiokafka')}"

    def run(self, spec: KafkaSpec, sampler: EndOffsetSampler) -> Attempt:
        wl = spec.workload
        interval = spec.interval_s if spec.interval_s > 0 else 1.0
        cmd = [
            sys.executable,
            str(PEERS_DIR / "bare_aiokafka.py"),
            wl.bootstrap,
            wl.input_topic,
            spec.output_topic,
            f"{interval:g}",
            str(wl.partitions),
        ]
        rec = run_monitored(
            cmd, timeout=spec.timeout, log_path=spec.run_dir / "worker.log", on_sample=sampler
        )
        return Attempt(
            rec,
            spec.run_dir,
            {"transaction_interval_s": interval, "max_records": 2048, "uvloop": True},
            f"one Kafka transaction per {interval:g}s carrying the consumed offsets "
            "(send_offsets_to_transaction); counts not checkpointed (ceiling)",
        )


def _peer_env(spec: KafkaSpec, interval: float) -> dict[str, str]:
    """What every Kafka peer job reads from its environment."""
    wl = spec.workload
    return {
        **os.environ,
        "BENCH_BOOTSTRAP": wl.bootstrap,
        "BENCH_INPUT_TOPIC": wl.input_topic,
        "BENCH_OUTPUT_TOPIC": spec.output_topic,
        "BENCH_INTERVAL_S": f"{interval:g}",
        "BENCH_EVENTS": str(wl.events),
    }


def _run_peer(
    cmd: list[str], env: dict[str, str], spec: KafkaSpec, sampler: EndOffsetSampler
) -> ProcessRecord:
    """Run a Kafka peer job in its run directory, sampled like every system."""
    return run_monitored(
        cmd,
        env=env,
        cwd=spec.run_dir,
        timeout=spec.timeout,
        log_path=spec.run_dir / "worker.log",
        on_sample=sampler,
    )


class QuixStreams(_PeerSystem, KafkaSystem):
    """Quix Streams with ``processing_guarantee="exactly-once"``, 1 s commit interval."""

    name = "quixstreams"
    path = "kafka"
    env_name = dist = "quixstreams"

    def run(self, spec: KafkaSpec, sampler: EndOffsetSampler) -> Attempt:  # type: ignore[override]
        env = self.env()
        assert env.python is not None
        interval = spec.interval_s if spec.interval_s > 0 else 1.0
        run_env = {
            **_peer_env(spec, interval),
            "BENCH_GROUP": f"quix-{spec.output_topic}",
            "BENCH_STATE_DIR": str(spec.run_dir / "state"),
        }
        rec = _run_peer(
            [str(env.python), str(PEERS_DIR / "quix_pv_count.py")], run_env, spec, sampler
        )
        return Attempt(
            rec,
            spec.run_dir,
            {
                "processing_guarantee": "exactly-once",
                "commit_interval_s": interval,
                "commit_every": 0,
                "use_changelog_topics": True,
                "state": "RocksDB",
                "job": "dataframe -> group_by('app_id') -> apply(stateful count) -> to_topic",
            },
            f"exactly-once: one Kafka transaction per checkpoint every {interval:g}s "
            "(outputs, repartition, changelog, offsets); RocksDB state with changelog topic",
        )


class Faust(_PeerSystem, KafkaSystem):
    """faust-streaming with ``processing_guarantee="exactly_once"``, 1 s commit interval."""

    name = "faust"
    path = "kafka"
    env_name = "faust"
    dist = "faust-streaming"

    def run(self, spec: KafkaSpec, sampler: EndOffsetSampler) -> Attempt:  # type: ignore[override]
        env = self.env()
        assert env.python is not None
        wl = spec.workload
        interval = spec.interval_s if spec.interval_s > 0 else 1.0
        run_env = {
            **_peer_env(spec, interval),
            "BENCH_APP_ID": f"faust-{spec.output_topic}",
            "BENCH_DATADIR": str(spec.run_dir / "faust-data"),
            "BENCH_PARTITIONS": str(wl.partitions),
        }
        rec = _run_peer(
            [str(env.python), str(PEERS_DIR / "faust_pv_count.py"), "worker", "-l", "warn"],
            run_env,
            spec,
            sampler,
        )
        return Attempt(
            rec,
            spec.run_dir,
            {
                "processing_guarantee": "exactly_once",
                "broker_commit_interval_s": interval,
                "broker_commit_every": "off (2**40)",
                "store": "memory:// (changelog topic)",
                "stream_buffer_maxsize": 32768,
                "producer_linger_s": 0.005,
                "producer_max_batch_size": 512 * 1024,
                "job": "agent: stream.group_by(app_id) -> Table count -> topic.send",
            },
            f"exactly-once: transactional producer per partition, commits every {interval:g}s "
            "with offsets; in-memory table backed by its changelog topic",
        )


def system_for(name: str) -> KafkaSystem | None:
    classes: dict[str, type[KafkaSystem]] = {
        "aiostream-ckpt": OursKafka,
        "bare-aiokafka": BareAiokafka,
        "quixstreams": QuixStreams,
        "faust": Faust,
    }
    cls = classes.get(name)
    return cls() if cls is not None else None


# -- running it --------------------------------------------------------------------------


def create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    from aiostream_ckpt_dev.demo.kafka import create_topics

    asyncio.run(create_topics(bootstrap, {topic: partitions}))


def measure_kafka(
    system: KafkaSystem,
    wl: KafkaWorkload,
    work: Path,
    *,
    repeats: int,
    interval_s: float,
    mode: str,
    sets: Sequence[str] = (),
    experiment: str = "compare",
    budget_s: float = 600.0,
) -> Measured:
    """Run ``system`` ``repeats`` times on the loaded topic; figures are medians over repeats.

    A slow peer gets fewer repeats rather than hours: no repeat starts that
    would take the system's runs past ``budget_s`` (judged by the last run).
    The repeats done are in ``config.repeats``.
    """
    res = RunResult(system=system.name, path="kafka", experiment=experiment, events=wl.events)
    m = Measured(res)
    try:
        why = system.unavailable_reason()
    except Exception as exc:  # a peer env that cannot even be created
        why = f"{type(exc).__name__}: {exc}"
    if why:
        res.status, res.reason = "unavailable", why
        say(f"{system.name} (kafka): cannot run here: {why}")
        return m
    host, port = wl.host_port
    rates, walls, rss, attempts, backgrounds = [], [], [], [], []
    spent = 0.0
    for i in range(repeats):
        if i > 0 and spent + walls[-1] > budget_s:
            say(
                f"  {system.name}: {i} of {repeats} repeats done in {spent:.0f}s; another would "
                f"pass the {budget_s:.0f}s budget per system: stopping here"
            )
            break
        run_dir = work / f"kafka-{experiment}-{system.name}-{i}"
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        topic = f"pv-out-{system.name}-{i}-{uuid.uuid4().hex[:6]}"
        create_topic(wl.bootstrap, topic, wl.partitions)
        spec = KafkaSpec(
            wl,
            run_dir,
            topic,
            interval_s=interval_s,
            mode=mode,
            sets=list(sets),
            timeout=run_timeout_s(wl.events),
        )
        say(f"kafka {experiment}: {system.name} run {i + 1}/{repeats} ({wl.events:,} events) ...")
        backgrounds.append(round(wait_for_quiet(say=say, max_wait=runner.QUIET_WAIT[0]), 2))
        sampler = EndOffsetSampler(host, port, topic, wl.partitions)
        try:
            attempt = system.run(spec, sampler)
            sampler.sample_at(attempt.record.wall_s)  # the end offsets once it has exited
        finally:
            sampler.close()
        rec = attempt.record
        if rec.exit_code != 0:
            res.status = "failed"
            res.reason = (
                f"exit {rec.exit_code}{' (timed out)' if rec.timed_out else ''}: "
                + " | ".join(ln.strip() for ln in rec.tail(6).splitlines() if ln.strip())[-700:]
            )
            say(f"{system.name} (kafka): FAILED: {res.reason}")
            return m
        samples = sampler.samples
        win = steady_window(samples, float(wl.events))
        rate = win.rate if win else wl.events / rec.wall_s
        verdict = recount_topic(wl.bootstrap, topic, wl.source.paths[0])
        m.python_verdicts.append(verdict)
        m.outputs.append(Path(topic))
        rates.append(rate)
        walls.append(rec.wall_s)
        spent += rec.wall_s
        rss.append(rec.peak_rss_kb / 1024)
        attempts.append((attempt, win, samples))
        say(
            f"  {rate:,.0f} events/s steady, {rec.wall_s:.1f}s wall, "
            f"peak RSS {rec.peak_rss_kb / 1024:.0f} MB, read_committed recount: {verdict.summary}"
        )
    summarize_repeats(res, wl.events, rates, walls, rss)
    order = sorted(range(len(rates)), key=rates.__getitem__)
    mid_attempt, mid_win, mid_samples = attempts[order[len(order) // 2]]
    res.config = {
        **mid_attempt.config,
        "workload": wl.describe(),
        "repeats": len(rates),
        "repeats_asked": repeats,
        "output_topics": [str(p) for p in m.outputs],
        "background_cores_before_runs": backgrounds,
        "throughput_method": "output topic end offsets (high watermark) sampled every "
        f"{SAMPLE_EVERY_S:g}s, steady window 10-90% of the events",
    }
    describe_median(res, mid_attempt, backgrounds)
    res.series = {
        "progress": [(round(t, 3), round(v)) for t, v in mid_samples],
        "checkpoints": [(round(t, 3), cid, ms) for t, cid, ms, _ in mid_attempt.completed],
        "checkpoint_ms_all": [ms for a, _, _ in attempts for _, _, ms, _ in a.completed],
        "steady": [mid_win.t_start, mid_win.t_end] if mid_win else None,
        "bucket_rates": list(mid_win.bucket_rates) if mid_win else [],
    }
    verdicts = m.python_verdicts
    res.validator = "python"
    res.exactly_once_verified = overall_verdict([v.passed for v in verdicts])
    res.validation = {
        "python": [v.to_json() for v in verdicts],
        "summary": "; ".join(sorted({v.summary for v in verdicts})),
    }
    return m


def run_timeout_s(events: int) -> float:
    """Longest one run may take: 10 minutes, or 1 ms per event plus 200 s when more.

    >>> run_timeout_s(50_000), run_timeout_s(1_000_000)
    (600.0, 1200.0)
    """
    return max(600.0, events / 1000 + 200.0)


@dataclass
class KafkaPlan:
    systems: list[str]
    source: Workload
    repeats: int
    interval_s: float
    mode: str
    sets: list[str]
    work: Path
    spark: bool
    partitions: int = PARTITIONS


def run_kafka_path(plan: KafkaPlan) -> list[RunResult]:
    """Start the broker, load the input topic once, measure every system, validate, stop."""
    from aiostream_ckpt_dev.broker.process import KafkaBroker
    from aiostream_ckpt_dev.demo.kafka import load_jsonl

    broker_dir = plan.work / "kafka-broker"
    shutil.rmtree(broker_dir, ignore_errors=True)
    broker = KafkaBroker(broker_dir, start_timeout_s=300, heap="1g")
    say("kafka: starting the broker ...")
    try:
        broker.start()
    except Exception as exc:
        why = f"the Kafka broker did not start: {type(exc).__name__}: {str(exc)[:400]}"
        say(why)
        return [unavailable(s, "kafka", why) for s in plan.systems]
    try:
        bootstrap = broker.bootstrap_servers
        src = plan.source
        topic = f"pv-in-n{src.events}-k{src.keys}-s{src.seed}-z{src.skew:g}-e{src.event_size}"
        create_topic(bootstrap, topic, plan.partitions)
        say(f"kafka: loading {src.events:,} events into {topic} ({plan.partitions} partitions) ...")
        t0 = time.monotonic()
        loaded = asyncio.run(load_jsonl(bootstrap, topic, src.paths[0]))
        wl = KafkaWorkload(bootstrap, topic, plan.partitions, src, time.monotonic() - t0)
        say(f"kafka: loaded {loaded:,} events in {wl.load_s:.1f}s ({bootstrap})")
        measured: list[Measured] = []
        for name in plan.systems:
            system = system_for(name)
            if system is None:
                measured.append(
                    Measured(unavailable(name, "kafka", f"{name} has no Kafka-path job"))
                )
                continue
            m = measure_kafka(
                system,
                wl,
                plan.work,
                repeats=plan.repeats,
                interval_s=plan.interval_s,
                mode=plan.mode,
                sets=plan.sets if name == "aiostream-ckpt" else (),
            )
            if m.result.status != "unavailable":
                with contextlib.suppress(Exception):
                    ver = system.version()
                    if ver:
                        m.result.config["version"] = ver
            measured.append(m)
        if plan.spark:
            _spark_check(measured, src.paths[0], bootstrap)
        return [m.result for m in measured]
    finally:
        say("kafka: stopping the broker")
        broker.close()
        shutil.rmtree(broker_dir, ignore_errors=True)


def _spark_check(measured: list[Measured], input_path: Path, bootstrap: str) -> None:
    targets = [m for m in measured if m.result.status == "ok" and m.outputs]
    jobs = [
        {
            "id": f"{id(m)}-{i}",
            "input": str(input_path),
            "kafka_bootstrap": bootstrap,
            "kafka_topic": str(topic),
        }
        for m in targets
        for i, topic in enumerate(m.outputs)
    ]
    validate_with_spark(targets, jobs, "output topics, read_committed", "read_committed recount")
