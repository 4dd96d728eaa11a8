"""``aiostream-ckpt validate``: run the checks, print the report, exit 0 only on PASS.

Exit codes: 0 every check passed; 1 a check failed; 2 usage or setup error
(bad option, no Java, missing path); 3 the validation could not run (Spark
job or Kafka failure). Errors are one line on stderr and print no verdict, so
a script that looks for ``validation: PASS`` on the last line is never fooled.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import NoReturn

from aiostream_ckpt_dev.validate.errors import ValidationConfigError, ValidationError
from aiostream_ckpt_dev.validate.readers import ISOLATION_LEVELS, OutputSource

CHECKS = ("pv_count", "positions")

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="aiostream-ckpt validate",
        description=(
            "The demos' built-in checks: their committed output (per-key counts, read "
            "positions) against their input, with PySpark. Any other app: validate --app."
        ),
    )
    p.add_argument("--check", action="append", choices=CHECKS, help="repeatable; default pv_count")
    p.add_argument(
        "--input",
        nargs="+",
        action="extend",
        required=True,
        metavar="PATH",
        help="JSON-lines input files or directories",
    )
    out = p.add_argument_group("output (one of)")
    out.add_argument("--output-dir", metavar="DIR", help="the exactly-once file sink's directory")
    out.add_argument("--kafka-bootstrap", metavar="HOST:PORT")
    out.add_argument("--kafka-topic", metavar="TOPIC")
    p.add_argument(
        "--isolation",
        choices=ISOLATION_LEVELS,
        default="read_committed",
        help="Kafka isolation level (read_uncommitted only to show aborted records)",
    )
    p.add_argument("--json", metavar="PATH", help="write the full report here")
    p.add_argument("--master", help="Spark master (default local[2])")
    p.add_argument("--key-field", default="app_id", help="pv_count: key field (default app_id)")
    p.add_argument("--count-field", default="pv", help="pv_count: count field (default pv)")
    p.add_argument("--pos-field", default="_pos", help="positions: field with [source, offset]")
    p.add_argument("--require-field", help="positions: input lines need this string field")
    p.add_argument("--prefix", default="part", help="committed file prefix (default part)")
    p.add_argument("--max-examples", type=int, default=20)
    return p


def validate_main(argv: list[str]) -> int:
    """Run ``aiostream-ckpt validate`` with ``argv``; return the exit code."""
    if any(a == "--app" or a.startswith("--app=") for a in argv):
        from aiostream_ckpt_dev.validate.proof_cli import proof_main

        return proof_main(argv)  # the reference-run proof of any app
    if any(a in ("-h", "--help") for a in argv):
        from aiostream_ckpt_dev.validate.proof_cli import build_parser as proof_parser

        print(f"{proof_parser().format_help()}\n{build_parser().format_help()}", end="")
        return EXIT_PASS
    try:
        args = build_parser().parse_args(argv)
        kafka = args.kafka_bootstrap is not None or args.kafka_topic is not None
        if kafka == (args.output_dir is not None):
            raise _UsageError("give either --output-dir or --kafka-bootstrap with --kafka-topic")
        if kafka and not (args.kafka_bootstrap and args.kafka_topic):
            raise _UsageError("--kafka-bootstrap and --kafka-topic go together")
    except _UsageError as exc:
        print(f"aiostream-ckpt validate: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return _run(args, kafka)
    except ValidationConfigError as exc:
        print(f"aiostream-ckpt validate: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        print(f"aiostream-ckpt validate: could not validate: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR


def _run(args: argparse.Namespace, kafka: bool) -> int:
    from aiostream_ckpt_dev.validate.checks import positions_check, pv_count_check
    from aiostream_ckpt_dev.validate.readers import (
        input_files,
        read_file_sink_output,
        read_kafka_output,
    )
    from aiostream_ckpt_dev.validate.result import ValidationReport, print_report
    from aiostream_ckpt_dev.validate.session import get_spark

    input_files(args.input)  # fail on a bad path before paying for a JVM
    started = time.monotonic()
    spark = get_spark(args.master, kafka=kafka)
    startup = time.monotonic() - started
    output: OutputSource
    if kafka:
        output = read_kafka_output(
            spark, args.kafka_bootstrap, args.kafka_topic, isolation=args.isolation
        )
    else:
        output = read_file_sink_output(spark, args.output_dir, prefix=args.prefix)
    results = []
    for check in args.check or ["pv_count"]:
        if check == "pv_count":
            results.append(
                pv_count_check(
                    spark,
                    args.input,
                    output,
                    key_field=args.key_field,
                    count_field=args.count_field,
                    max_examples=args.max_examples,
                )
            )
        else:
            results.append(
                positions_check(
                    spark,
                    args.input,
                    output,
                    pos_field=args.pos_field,
                    require_field=args.require_field,
                    max_examples=args.max_examples,
                )
            )
    report = ValidationReport(results, time.monotonic() - started, startup)
    print_report(report, args.json)
    return EXIT_PASS if report.passed else EXIT_FAIL


def _one_line(exc: BaseException) -> str:
    """Say what went wrong in one line; for a JVM error, its root cause, not py4j's wrapper."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            while java.getCause() is not None:
                java = java.getCause()
            return str(java.toString())[:500]
        except Exception:
            pass  # the gateway may be gone; fall back to the Python text
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = lines[0] if lines else type(exc).__name__
    if not isinstance(exc, ValidationError):
        text = f"{type(exc).__name__}: {text}"
    return text[:500]
