"""Avro values vs JSON values, Kafka to Kafka exactly-once: the job's CPU per million records.

``python -m bench.kafka_formats`` starts one broker and the stand-in schema
registry, loads the same seeded events twice (JSON into one topic; Avro in the
Confluent wire format into another), then runs pv_count (``aiostream-ckpt
run apps.pv_count``, exactly-once sink, bounded by the input's end offsets)
alternately on the two (JSON, Avro, JSON, Avro, ...), each run into a fresh
output topic. The figure is the job process's own CPU time (user + system,
``wait4``), per million records, and the Avro/JSON ratio per adjacent pair;
the median of the pairs is reported. Every output is read ``read_committed``
and recounted against the input before its figure counts: a run that is not
exactly-once is refused. Run it under ``cpu-lock exclusive`` (minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from aiostream_ckpt.connectors.generator import write_generated_jsonl
from aiostream_ckpt_dev.broker import KafkaBroker
from aiostream_ckpt_dev.demo.kafka import create_topics, load_avro, load_jsonl, read_topic_values
from aiostream_ckpt_dev.schema_registry import SchemaRegistryStandIn
from aiostream_ckpt_dev.validate.confluent_avro import ConfluentAvroDecoder

PARTITIONS = 4


def run_job(
    bootstrap: str, in_topic: str, out_topic: str, work: Path, avro: str | None
) -> dict[str, float]:
    """Run pv_count to the end of ``in_topic``; its CPU and wall seconds."""
    sets = [
        f"job.name=bench-{out_topic}",
        f"checkpoint.dir={work / out_topic}",
        "checkpoint.interval=1s",
        "rest.enabled=false",
        f"app.kafka_bootstrap={bootstrap}",
        f"app.input_topic={in_topic}",
        f"app.output_topic={out_topic}",
        "app.stop_at_end=1",
    ]
    if avro is not None:
        sets += ["app.format=avro", f"app.schema_registry={avro}"]
    cmd = [sys.executable, "-m", "aiostream_ckpt.daemon.cli", "run", "apps.pv_count"]
    cmd += [a for s in sets for a in ("--set", s)]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"pv_count failed (exit {proc.returncode}):\n{err[-2000:]}")
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": wall}


def expected_counts(path: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    with open(path, "rb") as f:
        for line in f:
            counts[orjson.loads(line)["app_id"]] += 1
    return counts


def exactly_once(bootstrap: str, topic: str, expected: Counter[str], decode: Any) -> bool:
    """Every key's updates are 1..n, in order, once: what a failure-free run commits."""
    values = asyncio.run(read_topic_values(bootstrap, topic))
    seen: dict[str, int] = {}
    for raw in values:
        update = orjson.loads(decode(raw) if decode else raw)
        key, pv = update["app_id"], update["pv"]
        if pv != seen.get(key, 0) + 1:
            return False
        seen[key] = pv
    return seen == dict(expected)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kafka_formats", description=__doc__)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-formats-") as tmp:
        work = Path(tmp)
        events = work / "events.jsonl"
        write_generated_jsonl(events, args.events, seed=7, keys=args.keys)
        expected = expected_counts(events)
        # the bench's broker keeps the full JIT (as bench/kafka.py's)
        with KafkaBroker(work / "broker", jvm_options=(), start_timeout_s=300) as broker, \
                SchemaRegistryStandIn() as registry:  # fmt: skip
            bootstrap = broker.bootstrap_servers
            asyncio.run(create_topics(bootstrap, {"in-json": PARTITIONS, "in-avro": PARTITIONS}))
            asyncio.run(load_jsonl(bootstrap, "in-json", events))
            asyncio.run(load_avro(bootstrap, "in-avro", events, registry.url))
            decode = ConfluentAvroDecoder(registry.url)
            runs: list[dict[str, Any]] = []
            for i in range(args.pairs):
                for fmt in ("json", "avro"):
                    out = f"out-{fmt}-{i}"
                    asyncio.run(create_topics(bootstrap, {out: PARTITIONS}))
                    avro = registry.url if fmt == "avro" else None
                    took = run_job(bootstrap, f"in-{fmt}", out, work, avro)
                    ok = exactly_once(bootstrap, out, expected, decode if avro else None)
                    per_m = took["cpu_s"] / args.events * 1e6
                    runs.append(
                        {"format": fmt, "pair": i, **took, "cpu_s_per_m": per_m, "exactly_once": ok}
                    )
                    verdict = "yes" if ok else "NO"
                    print(
                        f"{fmt:5} pair {i}: {took['cpu_s']:.2f} CPU s ({per_m:.2f} s/M records),"
                        f" {took['wall_s']:.1f} s wall, exactly-once {verdict}",
                        flush=True,
                    )
    refused = [r for r in runs if not r["exactly_once"]]
    if refused:
        print(f"REFUSED: {len(refused)} runs not exactly-once; no figure")
        return 1
    ratios = [runs[2 * i + 1]["cpu_s"] / runs[2 * i]["cpu_s"] for i in range(args.pairs)]
    median = {
        fmt: statistics.median(r["cpu_s_per_m"] for r in runs if r["format"] == fmt)
        for fmt in ("json", "avro")
    }
    print(
        f"CPU s per million records: JSON {median['json']:.2f}, Avro {median['avro']:.2f}; "
        f"Avro/JSON median of {args.pairs} pairs {statistics.median(ratios):.2f} "
        f"(pairs: {', '.join(f'{r:.2f}' for r in ratios)}); load {os.getloadavg()[0]:.1f}"
    )
    if args.json:
        args.json.write_bytes(orjson.dumps(
            {"events": args.events, "keys": args.keys, "runs": runs, "ratios": ratios,
             "median_cpu_s_per_m": median, "loadavg": os.getloadavg()},
            option=orjson.OPT_INDENT_2,
        ))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
