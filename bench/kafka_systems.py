"""The systems of the Kafka path and how each one is run on the loaded input topic.

* ``aiostream-ckpt``: ``apps.pv_count`` in Kafka mode (KafkaSource ->
  keyed count -> two-phase-commit KafkaSink), exactly-once, 1 s checkpoints;
* ``bare-aiokafka``: ``bench/peers/bare_aiokafka.py``, the ceiling;
* ``quixstreams``: ``bench/peers/quix_pv_count.py`` in its own venv;
* ``faust``: ``bench/peers/faust_pv_count.py`` in its own venv.
"""

from __future__ import annotations

import os
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.kafka_offsets import EndOffsetSampler
from bench.monitor import ProcessRecord, run_monitored
from bench.systems import (
    PEERS_DIR,
    Attempt,
    Ours,
    Workload,
    _CheckpointPoller,
    _PeerSystem,
    completed_from_lines,
    ours_env_cwd,
)


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
