"""pv_count for PyFlink (DataStream API): text FileSource -> key_by app_id -> ValueState count -> FileSink.

Env: BENCH_INPUT (a JSONL file), BENCH_OUTPUT (the FileSink's directory),
BENCH_INTERVAL_MS (checkpoint interval), BENCH_CKPT (checkpoint dir);
optional BENCH_PYFLINK_DEFAULTS=1 drops the throughput settings (for comparison).

Best honest configuration found: parallelism 1, exactly-once checkpoints every
BENCH_INTERVAL_MS to the filesystem (hashmap state), python.execution-mode=thread,
python.state.cache-size and python.fn-execution.bundle.size raised.

The Python functions run in an interpreter embedded in the JVM (pemja), which
finds libpython by running ``python.executable`` -- by default the ``python`` on
PATH, not this virtualenv's. Without pyflink (and find_libpython) that one
fails, every task fails in ``open()``, and the default exponential-delay restart
strategy retries forever: the job idles with no output. So both executables are
pinned to this interpreter, and a few fixed restarts make a hard failure end the
job (``env.execute`` raises) instead of idling until the bench's timeout.

Output: the FileSink rolls its part file on every checkpoint and commits it when
the checkpoint completes (``OnCheckpointRollingPolicy``, like our file sink);
at the end of the bounded input the final checkpoint commits the rest
(``execution.checkpointing.checkpoints-after-tasks-finish``, on by default).
One bucket (``BasePathBucketAssigner``), files ``part-<uuid>-<counter>.jsonl``.
"""

import os
import site
import sys
import traceback

import orjson
from pyflink.common import Configuration, Types, WatermarkStrategy
from pyflink.common.serialization import Encoder
from pyflink.datastream import CheckpointingMode, StreamExecutionEnvironment
from pyflink.datastream.connectors.file_system import (
    BucketAssigner,
    FileSink,
    FileSource,
    OutputFileConfig,
    RollingPolicy,
    StreamFormat,
)
from pyflink.datastream.functions import KeyedProcessFunction, RuntimeContext
from pyflink.datastream.state import ValueStateDescriptor


def app_id(line):
    return orjson.loads(line)["app_id"]


class Count(KeyedProcessFunction):
    def open(self, ctx: RuntimeContext):
        self.pv = ctx.get_state(ValueStateDescriptor("pv", Types.LONG()))

    def process_element(self, value, ctx):
        n = (self.pv.value() or 0) + 1
        self.pv.update(n)
        yield orjson.dumps({"app_id": ctx.get_current_key(), "pv": n}).decode()


def settings() -> dict[str, str]:
    conf = {
        # The embedded interpreter and the client: this virtualenv's Python, not PATH's.
        "python.executable": sys.executable,
        "python.client.executable": sys.executable,
        # The embedded interpreter starts from the base installation's libpython, whose
        # sys.path lacks this virtualenv's site-packages (pemja, pyflink, orjson).
        "python.pythonpath": os.pathsep.join(site.getsitepackages()),
        "python.execution-mode": "thread",
        "execution.checkpointing.dir": "file://" + os.environ["BENCH_CKPT"],
        "state.backend.type": "hashmap",
        "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": "3",
        "restart-strategy.fixed-delay.delay": "1 s",
    }
    if os.environ.get("BENCH_PYFLINK_DEFAULTS") != "1":
        conf["python.state.cache-size"] = "100000"
        conf["python.fn-execution.bundle.size"] = "10000"
    return conf


def main():
    conf = Configuration()
    for k, v in settings().items():
        conf.set_string(k, v)
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_parallelism(1)
    env.enable_checkpointing(
        int(os.environ.get("BENCH_INTERVAL_MS", "1000")), CheckpointingMode.EXACTLY_ONCE
    )
    src = FileSource.for_record_stream_format(
        StreamFormat.text_line_format(), os.environ["BENCH_INPUT"]
    ).build()
    lines = env.from_source(src, WatermarkStrategy.no_watermarks(), "input")
    counts = lines.key_by(app_id, key_type=Types.STRING()).process(
        Count(), output_type=Types.STRING()
    )
    sink = (
        FileSink.for_row_format(os.environ["BENCH_OUTPUT"], Encoder.simple_string_encoder())
        .with_bucket_assigner(BucketAssigner.base_path_bucket_assigner())
        .with_rolling_policy(RollingPolicy.on_checkpoint_rolling_policy())
        .with_output_file_config(
            OutputFileConfig.builder().with_part_prefix("part").with_part_suffix(".jsonl").build()
        )
        .build()
    )
    counts.sink_to(sink)
    try:
        env.execute("pv_count")
    except Exception as exc:
        # The Java trace is long; end the log with its root cause, for the bench's tail.
        traceback.print_exc()
        causes = [ln.strip() for ln in str(exc).splitlines() if ln.startswith("Caused by:")]
        print(f"pyflink job failed: {causes[-1] if causes else exc!r}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
