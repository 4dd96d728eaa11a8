"""The ``aiostream-ckpt`` command line.

Exit codes of ``run``: 0 the job finished, stopped with a savepoint or was
cancelled (stopped cleanly), 1 the job failed,
2 a bad start: a usage, config or app error, or a directory another running job
owns (one line on stderr naming the cause, or the owner).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from aiostream_ckpt import failpoints
from aiostream_ckpt.errors import AiostreamError, ConfigError, JobFailedError

log = logging.getLogger("aiostream_ckpt")

#: Dev tooling's subcommands (package ``aiostream_ckpt_dev``), by entry point: named, not
#: imported, so the engine never imports its tooling and ``run`` never loads it.
TOOLING_COMMANDS = {
    "broker": "aiostream_ckpt_dev.broker.cli:broker_main",
    "chaos": "aiostream_ckpt_dev.chaos.cli:chaos_main",
    "demo": "aiostream_ckpt_dev.demo.files:demo_main",
    "demo-kafka": "aiostream_ckpt_dev.demo.kafka:demo_kafka_main",
    "validate": "aiostream_ckpt_dev.validate.cli:validate_main",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="aiostream-ckpt",
        description="Run stream apps with Flink-style checkpoints and exactly-once output.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run an app module (resumes from its checkpoints)")
    run.add_argument("module", help="app module (apps.pv_count) or file (apps/pv_count.py)")
    run.add_argument("--config", type=Path, help="TOML config file")
    run.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (highest precedence); repeatable",
    )
    run.add_argument("--from-savepoint", type=Path, help="restore from this savepoint")
    run.add_argument(
        "--shard",
        metavar="I/N",
        help="run shard I of N: the key groups of partition I of N of key-grouped inputs, "
        "with its own checkpoints under <checkpoint.dir>/shard-I-of-N (job.shard)",
    )
    run.add_argument(
        "--allow-non-restored-state",
        action="store_true",
        help="drop savepoint state of operators (uids) the job no longer has",
    )
    run.add_argument(
        "--allow-retract-output",
        action="store_true",
        help="let a savepoint restore move output committed after the savepoint to "
        "<output>/_retracted/ (with a manifest) and produce it again",
    )
    run.add_argument(
        "--allow-duplicate-output",
        action="store_true",
        help="let a restore to an older point write again the records of output that cannot "
        "be retracted (committed Kafka transactions): read_committed consumers see duplicates",
    )
    run.add_argument(
        "--log-format", choices=["text", "json"], help="log lines as text (default) or JSON"
    )
    run.add_argument(
        "--progress",
        type=float,
        metavar="SECONDS",
        help="print a progress line to stderr every SECONDS (progress.interval)",
    )

    ck = sub.add_parser("checkpoints", help="list or inspect checkpoints")
    ck_sub = ck.add_subparsers(dest="action", required=True)
    ls = ck_sub.add_parser("list", help="checkpoints, then savepoints (DIR/savepoints)")
    ls.add_argument("directory", type=Path)
    ls.add_argument("--savepoint-dir", type=Path, help="also list savepoints here (savepoint.dir)")
    ins = ck_sub.add_parser("inspect")
    ins.add_argument("directory", type=Path)
    ins.add_argument("id", type=int, nargs="?")

    from aiostream_ckpt.daemon.client import add_client_args

    sp = sub.add_parser("savepoint", help="savepoints of a running daemon (REST)")
    sp_sub = sp.add_subparsers(dest="action", required=True)
    for action, text in (("trigger", "take a savepoint"), ("stop", "stop-with-savepoint")):
        a = sp_sub.add_parser(action, help=text)
        add_client_args(a)
        a.add_argument("--dir", type=Path, help="savepoint parent directory (savepoint.dir)")
    dispose = sp_sub.add_parser(
        "dispose", help="remove a savepoint and the output copies it holds (not one in use)"
    )
    add_client_args(dispose)
    dispose.add_argument("savepoint", help="the savepoint's path, or its id")
    health = sub.add_parser("health", help="exit 0 when the daemon's /health answers")
    add_client_args(health, token=False)
    health.add_argument("--timeout", type=float, default=5.0)
    health.add_argument(
        "--address-file",
        type=Path,
        help="the daemon's address file (default: rest.address_file or "
        "<checkpoint.dir>/daemon.json from the AIOSTREAM_* environment)",
    )

    # declared here, not by daemon.transactions: that imports aiokafka (~0.25 s of CPU),
    # which every other command, ``run`` of a job without Kafka included, would pay
    tx = sub.add_parser("transactions", help="a stopped job's Kafka transactions: list, repair")
    tx_sub = tx.add_subparsers(dest="action", required=True)
    for action, text in (
        ("list", "each transactional id the job owns: state, age, checkpoint"),
        ("commit", "commit ID, if the newest completed checkpoint pre-committed it"),
        ("abort", "abort ID's open transaction (never one a completed checkpoint holds)"),
    ):
        a = tx_sub.add_parser(action, help=text)
        if action != "list":
            a.add_argument("id")
        a.add_argument("--checkpoint-dir", type=Path, required=True)
        a.add_argument("--bootstrap", required=True, help="Kafka host:port[,host:port]")
        a.add_argument("--prefix", action="append", default=[], help="also this id prefix")
        a.add_argument(
            "--config", type=Path, help="the job's TOML config (its kafka.* keys: TLS, SASL)"
        )
        a.add_argument(
            "--set",
            dest="sets",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a config key, e.g. kafka.security_protocol=SASL_SSL (AIOSTREAM_KAFKA__* too)",
        )
        if action == "list":
            a.add_argument("--json", action="store_true", help="JSON rows instead of a table")
    rs = sub.add_parser(
        "rescale",
        help="merge every shard's stop-with-savepoint into the restore point of M new shards",
    )
    where = rs.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--checkpoint-dir",
        type=Path,
        help="the job's checkpoint.dir: each shard's stop-with-savepoint is found there",
    )
    where.add_argument(
        "--from",
        dest="savepoints",
        metavar="SP[,SP...]",
        help="the savepoints of every shard, comma-separated (taken with stop-with-savepoint)",
    )
    rs.add_argument("--shards", type=int, required=True, metavar="M", help="new number of shards")
    rs.add_argument(
        "--from-shards",
        type=int,
        metavar="N",
        help="the layout to rescale when checkpoint.dir holds stopped shards of several",
    )
    rs.add_argument("--out", type=Path, help="directory of the rescale point (a new one)")
    sub.add_parser("broker", help="a local Kafka broker for development", add_help=False)
    sub.add_parser(
        "validate",
        help="prove exactly-once: an app's output against a failure-free run (--app)",
        add_help=False,
    )
    sub.add_parser(
        "chaos", help="kill -9 across the checkpoint windows, then prove", add_help=False
    )
    sub.add_parser("demo", help="the page-view-count demo under kill -9", add_help=False)
    sub.add_parser("config-reference", help="every config key as a Markdown table", add_help=False)
    sub.add_parser("demo-kafka", help="the same demo, Kafka to Kafka", add_help=False)
    return p


def _run(args: argparse.Namespace) -> int:
    from aiostream_ckpt.daemon.config import load_config
    from aiostream_ckpt.daemon.logs import setup_logging
    from aiostream_ckpt.runtime.workers.worker_process import EarlyWorkers, WorkerLaunch

    failpoints.arm_from_env()  # before anything can fail: a bad spec is a usage error
    sets = list(args.sets)
    if args.from_savepoint is not None:
        sets.append(f"job.restore_from={args.from_savepoint}")
    if args.shard is not None:
        sets.append(f"job.shard={args.shard}")
    if args.allow_non_restored_state:
        sets.append("job.allow_non_restored_state=true")
    if args.allow_retract_output:
        sets.append("job.allow_retract_output=true")
    if args.allow_duplicate_output:
        sets.append("job.allow_duplicate_output=true")
    if args.log_format:
        sets.append(f"log.format={args.log_format}")
    loaded = load_config(args.config, env=os.environ, sets=sets)
    setup_logging(loaded.log_format, loaded.log_level)
    # job.workers > 1: each worker process builds the job from the same module and config
    launch = WorkerLaunch(args.module, args.config, tuple(sets), loaded.job.workers)

    # the workers first, so that their start overlaps this process's imports and build of
    # the job; not when the job would run fewer (job.place_workers: its widest operator)
    first = 1 < loaded.job.validate().workers <= loaded.job.parallelism

    async def main() -> int:
        early = EarlyWorkers(launch) if first else None
        try:
            if early is not None:
                await early.spawn()
            return await run(early)
        finally:
            if early is not None:
                await early.close()  # those the job did not take (it failed to build or start)

    async def run(early: EarlyWorkers | None) -> int:
        from aiostream_ckpt.api.environment import StreamEnvironment
        from aiostream_ckpt.daemon.app_loader import app_name, build_app
        from aiostream_ckpt.daemon.service import JobDaemon
        from aiostream_ckpt.runtime.job import JobStatus

        name = loaded.job_name or app_name(args.module)
        env = StreamEnvironment(name, config=loaded.job, params=loaded.params)
        build_app(args.module, env)
        daemon = JobDaemon(env.spec(), loaded.daemon, launch=launch, early=early)
        runner = daemon.runner
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, daemon.request_shutdown)
        progress = _Progress(runner)
        printing = None
        every = args.progress if args.progress is not None else loaded.progress_interval
        if every > 0:
            printing = asyncio.create_task(progress.run(every))
        try:
            result = await daemon.run()
        finally:
            if printing is not None:
                printing.cancel()
                await asyncio.gather(printing, return_exceptions=True)
        if printing is not None:
            progress.line()  # the totals at the end, whenever the last tick was
        log.info(
            "job %r %s (%d restarts, last checkpoint %s)",
            name,
            result.status.value,
            result.restarts,
            result.last_checkpoint,
        )
        if result.status is JobStatus.FINISHED and result.restarts == 0:
            _warn_if_nothing_was_read(name, runner.run_state)
        summary: dict[str, Any] = {
            "status": result.status.value,
            "restarts": result.restarts,
            "last_checkpoint": result.last_checkpoint,
        }
        if daemon.savepoints.final_savepoint is not None:
            summary["savepoint"] = str(daemon.savepoints.final_savepoint.path)
        summary_line.append(orjson.dumps(summary).decode())
        gc.collect()  # finalize clients' cyclic garbage while the loop still runs (see tune_gc)
        return 0 if result.status.ended_well else 1

    import uvloop

    summary_line: list[str] = []
    code = int(uvloop.run(main()))
    # printed once the loop is closed, so that it is the last line even when the
    # loop's teardown (cancelling what clients left behind) logs something
    for line in summary_line:
        print(line, file=sys.stderr)
    return code


def _warn_if_nothing_was_read(name: str, run: Any) -> None:
    """Warn when the job read nothing: most likely it was given an empty or wrong input."""
    if run.source_records() > 0:
        return
    restored = run.restored
    if restored is None:
        log.warning(
            "job %r finished without reading a single record: its sources were empty. Check "
            "the input the app was given (e.g. --set app.input=...): a missing or empty file "
            "or directory, an empty topic, or a glob that matched nothing",
            name,
        )
    else:
        log.warning(
            "job %r finished without reading a record: it resumed from %s %d, whose source "
            "positions were already at the end of its input (%s); a new run over the same "
            "input needs a fresh checkpoint.dir",
            name,
            "savepoint" if restored.is_savepoint else "checkpoint",
            restored.checkpoint_id,
            restored.directory,
        )


class _Progress:
    """The progress line: events the sources read in this attempt (every worker's summed)."""

    def __init__(self, runner: Any) -> None:
        self._runner = runner
        self._last_n, self._last_t = 0, time.monotonic()

    async def run(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            self.line()

    def line(self) -> None:
        run = self._runner.run_state
        n, t = run.source_records(), time.monotonic()
        dt = t - self._last_t
        rate = (n - self._last_n) / dt if n >= self._last_n and dt > 0 else 0.0
        self._last_n, self._last_t = n, t
        print(
            f"progress: events={n} rate={rate:,.0f}/s checkpoint={run.last_checkpoint()} "
            f"attempt={run.attempt}",
            file=sys.stderr,
            flush=True,
        )


def _checkpoints(args: argparse.Namespace) -> int:
    from aiostream_ckpt.daemon.inspection import inspect_checkpoint, list_checkpoints

    if args.action == "list":
        print("\n".join(list_checkpoints(args.directory, args.savepoint_dir)))
    else:
        info = inspect_checkpoint(args.directory, args.id)
        print(orjson.dumps(info, option=orjson.OPT_INDENT_2).decode())
    return 0


def _print_detail(exc: AiostreamError) -> None:
    """Print the app's traceback above the one-line cause, which stays the last line."""
    if exc.detail:
        print(exc.detail, file=sys.stderr)


def _tooling_command(name: str) -> Callable[[list[str]], int]:
    """Import the entry point of a tooling command; an install without the tooling says so."""
    module, function = TOOLING_COMMANDS[name].split(":")
    try:
        command: Callable[[list[str]], int] = getattr(importlib.import_module(module), function)
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("aiostream_ckpt_dev"):
            raise
        raise ConfigError(
            f"'{name}' is dev tooling (package aiostream_ckpt_dev), which this install "
            "lacks; reinstall the project (make setup)"
        ) from None
    return command


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, so a closed pipe is seen below and not at exit
        return code
    except BrokenPipeError:
        # the reader went away (`checkpoints inspect DIR | head`): it took what it
        # wanted; point stdout at /dev/null so the exit-time flush stays quiet
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _main(argv: list[str]) -> int:
    try:
        # subcommands with their own parsers get the rest of the line untouched
        if argv and argv[0] == "config-reference":
            from aiostream_ckpt.daemon.config_reference import config_reference_main

            return config_reference_main(argv[1:])
        if argv and argv[0] in TOOLING_COMMANDS:
            return _tooling_command(argv[0])(argv[1:])
        args = _parser().parse_args(argv)
        if args.command == "run":
            return _run(args)
        if args.command == "checkpoints":
            return _checkpoints(args)
        if args.command == "savepoint":
            from aiostream_ckpt.daemon.client import savepoint_main

            return savepoint_main(args)
        if args.command == "transactions":
            from aiostream_ckpt.daemon.transactions import transactions_main

            return transactions_main(args)
        if args.command == "rescale":
            from aiostream_ckpt.daemon.rescale import rescale_main

            return rescale_main(args)
        if args.command == "health":
            from aiostream_ckpt.daemon.client import health_main

            return health_main(args)
    except JobFailedError as exc:
        _print_detail(exc)
        print(f"aiostream-ckpt: {exc}", file=sys.stderr)
        return 1
    except AiostreamError as exc:
        _print_detail(exc)
        print(f"aiostream-ckpt: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
