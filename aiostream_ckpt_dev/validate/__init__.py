"""Prove exactly-once with PySpark: recompute from the input, compare with committed output.

Run it as ``aiostream-ckpt validate ...`` or ``python -m aiostream_ckpt_dev.validate``
(see :mod:`.cli`), or from Python::

    spark = get_spark()
    out = read_file_sink_output(spark, "out/")
    result = pv_count_check(spark, ["events.jsonl"], out)
    print_report(ValidationReport([result]), "report.json")
"""

from aiostream_ckpt_dev.validate.checks import positions_check, pv_count_check
from aiostream_ckpt_dev.validate.cli import validate_main
from aiostream_ckpt_dev.validate.errors import ValidationConfigError, ValidationError
from aiostream_ckpt_dev.validate.readers import (
    OutputSource,
    read_file_sink_output,
    read_input,
    read_kafka_output,
)
from aiostream_ckpt_dev.validate.result import CheckResult, ValidationReport, print_report
from aiostream_ckpt_dev.validate.session import get_spark, stop_spark

__all__ = [
    "CheckResult",
    "OutputSource",
    "ValidationConfigError",
    "ValidationError",
    "ValidationReport",
    "get_spark",
    "positions_check",
    "print_report",
    "pv_count_check",
    "read_file_sink_output",
    "read_input",
    "read_kafka_output",
    "stop_spark",
    "validate_main",
]
