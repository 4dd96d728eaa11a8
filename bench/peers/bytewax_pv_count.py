"""pv_count written idiomatically for Bytewax 0.21: file input -> key by app_id -> stateful_map -> file output.

Run: python -m bytewax.run bytewax_pv_count:flow -r RECOVERY_DIR -s 1 -b 0
with BENCH_INPUT (JSONL file) and BENCH_OUTPUT (output file) in the environment.
FileSource snapshots its byte offset and FileSink truncates to its snapshotted
offset on resume, so with recovery on the output is exactly-once.
"""

import os
from pathlib import Path

import bytewax.operators as op
import orjson
from bytewax.connectors.files import FileSink, FileSource
from bytewax.dataflow import Dataflow


def count(state, _event):
    n = (state or 0) + 1
    return n, n


def fmt(key_n):
    # FileSink takes (key, line) pairs; it has one partition, so the key only routes.
    key, n = key_n
    return key, orjson.dumps({"app_id": key, "pv": n}).decode()


flow = Dataflow("pv_count")
lines = op.input("inp", flow, FileSource(os.environ["BENCH_INPUT"], batch_size=int(os.environ.get("BENCH_BATCH", "1000"))))
events = op.map("parse", lines, orjson.loads)
keyed = op.key_on("key_by_app", events, lambda e: e["app_id"])
counts = op.stateful_map("count", keyed, count)
op.output("out", op.map("fmt", counts, fmt), FileSink(Path(os.environ["BENCH_OUTPUT"])))
