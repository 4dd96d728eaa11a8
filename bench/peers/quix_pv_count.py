"""pv_count on Quix Streams, exactly-once (run by the bench in its own venv).

Environment: BENCH_BOOTSTRAP, BENCH_INPUT_TOPIC, BENCH_OUTPUT_TOPIC, BENCH_GROUP,
BENCH_STATE_DIR, BENCH_INTERVAL_S, BENCH_EVENTS.

The idiomatic job: ``app.dataframe(input)`` -> ``group_by("app_id")`` (Quix's
repartition topic, since the input is not keyed by app_id) -> stateful
``apply`` keeping the count in RocksDB state (changelog topic on, Quix's
default and its recovery mechanism) -> ``to_topic(output)`` keyed by app_id.
``processing_guarantee="exactly-once"`` makes each checkpoint one Kafka
transaction (outputs, repartition records, changelog and consumer offsets),
committed every ``commit_interval`` seconds. The job stops itself after the
last event's update (``app.stop()``), which commits the final checkpoint.
"""

import os

from quixstreams import Application

EVENTS = int(os.environ["BENCH_EVENTS"])

app = Application(
    broker_address=os.environ["BENCH_BOOTSTRAP"],
    consumer_group=os.environ["BENCH_GROUP"],
    auto_offset_reset="earliest",
    processing_guarantee="exactly-once",
    commit_interval=float(os.environ["BENCH_INTERVAL_S"]),
    state_dir=os.environ["BENCH_STATE_DIR"],
    loglevel="WARNING",
)
source = app.topic(os.environ["BENCH_INPUT_TOPIC"], value_deserializer="json")
sink = app.topic(
    os.environ["BENCH_OUTPUT_TOPIC"], key_serializer="string", value_serializer="json"
)
processed = [0]


def count(event, state):
    n = state.get("pv", 0) + 1
    state.set("pv", n)
    processed[0] += 1
    if processed[0] == EVENTS:
        app.stop()  # graceful: the run loop commits the last checkpoint, then returns
    return {"app_id": event["app_id"], "pv": n}


sdf = app.dataframe(source)
sdf = sdf.group_by("app_id")
sdf = sdf.apply(count, stateful=True)
sdf.to_topic(sink)

if __name__ == "__main__":
    app.run()
