"""``aiostream-ckpt validate --app MODULE``: prove an app's committed output by a reference run.

Give the run's own config (``--config``, ``--set``; ``--input`` and
``--output`` are short for ``--set app.input=`` and the main output param).
The app runs once more, failure-free and embedded, into a scratch directory;
then every declared output and the dead letters are compared with their twins
(:mod:`.proof`). Outputs up to ``--fast-limit-mb`` are compared in Python
without Spark; larger ones (or ``--spark``, ``--master``) with PySpark
(:mod:`.proof_spark`). Exit codes as for ``validate``: 0 PASS, 1 FAIL,
2 usage (an app that declares no ``PROOF`` is refused here), 3 could not run.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from aiostream_ckpt.api.contract import ProofContract
from aiostream_ckpt.errors import AiostreamError
from aiostream_ckpt_dev.validate.errors import ValidationConfigError
from aiostream_ckpt_dev.validate.proof import (
    AppRun,
    ObjectOutput,
    assumptions,
    fast_results,
    load_contract,
    nondeterminism_note,
    output_bytes,
    plan_outputs,
    reference_run,
    reference_topics,
    twin_outputs,
)
from aiostream_ckpt_dev.validate.proof_kafka import KafkaTopic, drop_topics, record_span
from aiostream_ckpt_dev.validate.result import CheckResult, ValidationReport, print_report
from aiostream_ckpt_dev.validate.tables import is_delta_table

SECOND = "second-run"
EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3
DEFAULT_FAST_LIMIT_MB = 512.0
#: Kafka topics have no cheap byte size: their offset span (records, markers) instead.
DEFAULT_FAST_LIMIT_RECORDS = 5_000_000


def drop_reference(scratch: Path) -> None:
    """Remove the reference runs' directory and the topics they made (Kafka mode)."""
    drop_topics([*reference_topics(scratch).values(), *reference_topics(scratch / SECOND).values()])
    shutil.rmtree(scratch, ignore_errors=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="aiostream-ckpt validate",
        description=(
            "Prove exactly-once for any app: its committed output equals a failure-free "
            "reference run's (compared in Python; with PySpark for large outputs or --spark)."
        ),
    )
    p.add_argument("--app", required=True, metavar="MODULE", help="the app (apps.pv_count)")
    p.add_argument("--config", type=Path, help="the run's TOML config")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--input", nargs="+", action="extend", metavar="PATH", help="app.input")
    p.add_argument("--output", metavar="DIR", help="the main output (first declared param)")
    p.add_argument("--scratch", type=Path, help="reference run's directory (default: beside)")
    p.add_argument("--keep-reference", action="store_true")
    p.add_argument("--deterministic", action="store_true", help="assert it (app without PROOF)")
    add_reference_runs(p)
    p.add_argument("--fast-limit-mb", type=float, default=DEFAULT_FAST_LIMIT_MB)
    p.add_argument(
        "--fast-limit-records",
        type=int,
        default=DEFAULT_FAST_LIMIT_RECORDS,
        help="Kafka outputs: offsets spanned by both sides beyond which Spark compares",
    )
    p.add_argument("--spark", action="store_true", help="compare with PySpark whatever the size")
    p.add_argument("--master", help="Spark master (implies --spark; default local[2])")
    p.add_argument("--json", metavar="PATH", help="write the full report here")
    return p


def add_reference_runs(p: argparse.ArgumentParser) -> None:
    """``--reference-runs``: shared by ``validate --app`` and ``chaos``."""
    p.add_argument(
        "--reference-runs",
        type=int,
        choices=(1, 2),
        default=2,
        help="2 (default): a second failure-free run checks that the app is deterministic",
    )


def run_sets(args: argparse.Namespace, main_output: str) -> list[str]:
    sets = list(args.sets)
    if args.input:
        sets.append("app.input=" + ",".join(str(Path(p).resolve()) for p in args.input))
    if args.output:
        sets.append(f"app.{main_output}={Path(args.output).resolve()}")
    return sets


def proof_main(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        contract = load_contract(args.app, assume_deterministic=args.deterministic)
        run = AppRun(args.app, run_sets(args, contract.outputs[0]), args.config)
        main = plan_outputs(run, contract, Path("."))[0].actual  # checks the config, too
        if isinstance(main, KafkaTopic):
            beside = Path.cwd() / f".{main.topic}"
        elif isinstance(main, ObjectOutput):  # s3://bucket/prefix: a scratch dir here
            beside = Path.cwd() / f".{main.url.rstrip('/').rpartition('/')[2]}"
        else:
            beside = main
        scratch: Path = args.scratch or beside.parent / f".{beside.name}.reference"
    except (ValidationConfigError, AiostreamError) as exc:
        print(f"aiostream-ckpt validate: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        report = prove(
            run,
            contract,
            scratch,
            spark=args.spark or args.master is not None,
            master=args.master,
            fast_limit_mb=args.fast_limit_mb,
            fast_limit_records=args.fast_limit_records,
            reference_runs=args.reference_runs,
        )
    except ValidationConfigError as exc:
        print(f"aiostream-ckpt validate: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        print(f"aiostream-ckpt validate: could not validate: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if not args.keep_reference:
            drop_reference(scratch)
    print_report(report, args.json)
    return EXIT_PASS if report.passed else EXIT_FAIL


def prove(
    run: AppRun,
    contract: ProofContract,
    scratch: Path,
    *,
    spark: bool = False,
    master: str | None = None,
    fast_limit_mb: float = DEFAULT_FAST_LIMIT_MB,
    fast_limit_records: int = DEFAULT_FAST_LIMIT_RECORDS,
    reference_runs: int = 2,
) -> ValidationReport:
    """Run the reference (twice: the second checks determinism), then compare; one report."""
    started = time.monotonic()
    plan_outputs(run, contract, scratch)  # a config error stops before the reference run
    ref_seconds = reference_run(run, contract, scratch)
    plan = plan_outputs(run, contract, scratch)
    if reference_runs > 1:
        second = scratch / SECOND
        reference_run(run, contract, second)
        plan += twin_outputs(run, contract, scratch, second)
    places = [w for p in plan for w in (p.actual, p.reference)]
    size = output_bytes(w for w in places if isinstance(w, Path))
    topics = [w for w in places if isinstance(w, KafkaTopic)]
    spans = sum(record_span(t) for t in topics)
    use_spark = spark or size > fast_limit_mb * 1e6 or spans > fast_limit_records
    results: list[CheckResult]
    startup = 0.0
    if use_spark:
        from aiostream_ckpt_dev.validate.proof_spark import spark_results
        from aiostream_ckpt_dev.validate.session import get_spark

        t = time.monotonic()
        tables = any(isinstance(w, Path) and is_delta_table(w) for w in places)
        session = get_spark(master, kafka=bool(topics), delta=tables)
        startup = time.monotonic() - t
        results = spark_results(session, plan, contract)
    else:
        results = fast_results(plan, contract)
    path = "spark" if use_spark else "fast (no Spark)"
    for r in results:
        r.notes.append(f"{path} path; reference run took {ref_seconds:.1f}s")
        nondeterminism_note(r)
    report = ValidationReport(results, time.monotonic() - started, startup)
    report.assumptions = assumptions(contract, reference_runs)
    return report
