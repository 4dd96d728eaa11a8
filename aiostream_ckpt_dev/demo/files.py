"""``aiostream-ckpt demo``: pv_count over generated events, killed with SIGKILL, proven exact.

1. Generate the input (seeded JSON lines, with a few malformed lines that must
   end up in the dead-letter output, not in the counts).
2. Run ``aiostream-ckpt run apps.pv_count`` as a worker process with 1 s
   checkpoints; SIGKILL it at random moments (after it has completed a
   checkpoint in that attempt), restart it on the same checkpoint directory,
   until it finishes.
3. Check the committed output against a recount of the input: in Python
   first (seconds, said at once), then with Spark (``aiostream_ckpt_dev.validate``)
   as confirmation when PySpark is installed, with a line every 10 s while its
   JVM starts and runs. When Spark cannot run here (no PySpark, no Java) it
   says so and the Python recount decides.
4. Prove the windowed app (``apps.sessions``) under kill -9 against a
   failure-free run (:mod:`.windowed`), and print that verdict too.
   Prints ``exactly-once verified: ...`` or exits non-zero.

``--sink delta`` (or ``parquet``) writes the counts into a Delta table (or
Parquet part files) instead: step 3 is then the Python recount read through
delta-rs (pyarrow), and the reference-run proof against a failure-free run,
by Spark with Delta Lake for Spark when it can run (:mod:`.proof_spark`).

It works in a container too: its files go to ``./.demo``, or to the temp dir
when the working directory is not writable; the worker does not inherit the
``AIOSTREAM_*`` environment (the image's settings are not the demo's); SIGTERM
(``docker stop``, also as PID 1) stops the worker and exits 143.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from aiostream_ckpt.connectors.generator import write_generated_jsonl
from aiostream_ckpt.daemon.config import ENV_PREFIX
from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt_dev.chaos.kills import ChaosResult, run_with_kills
from aiostream_ckpt_dev.demo.windowed import prove_windowed, verified_line
from aiostream_ckpt_dev.recount import check_pv_count, python_recount, spark_unavailable
from aiostream_ckpt_dev.validate.proof import AppRun, load_contract
from aiostream_ckpt_dev.validate.proof_cli import prove
from aiostream_ckpt_dev.validate.result import print_report

MALFORMED_LINES = 3


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aiostream-ckpt demo", description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=3_000_000)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--kills", type=int, default=2)
    p.add_argument("--seed", type=int, default=None, help="default: random")
    p.add_argument(
        "--workdir", type=Path, help="default: ./.demo, or <tempdir>/aiostream-demo if unwritable"
    )
    p.add_argument("--interval", default="1s", help="checkpoint interval")
    p.add_argument("--parallelism", type=int, default=1)
    p.add_argument("--no-spark", action="store_true", help="verify in Python, not Spark")
    p.add_argument(
        "--sink",
        choices=("files", "parquet", "delta"),
        default="files",
        help="JSON-lines files (default), Parquet part files, or a Delta table",
    )
    p.add_argument(
        "--windowed-kills", type=int, default=2, help="kills for the windowed app (0: skip it)"
    )
    return p


def run_demo_worker(
    label: str,
    cmd: list[str],
    *,
    kills: int,
    seed: int,
    work: Path,
    inputs: list[Path] | None = None,
    env: dict[str, str] | None = None,
) -> ChaosResult | None:
    """Run the worker to the end under ``kills`` random SIGKILLs, echoing its progress.

    ``inputs``: the job's input files, so that kills are placed by how far it
    has read them (every kill happens, however fast the job); else by time.
    """

    def show(line: str) -> None:
        if line.startswith("progress:") or "completed in" in line or "restor" in line:
            print("  worker " + line.split(" INFO    ")[-1], flush=True)

    print(f"{label}: running pv_count, SIGKILL x{kills} at random moments")
    log = work / "worker.log"
    result = run_with_kills(
        cmd, kills=kills, seed=seed, log_path=log, on_line=show,
        max_delay_after_checkpoint=1.0, timeout=1800, inputs=inputs, env=env,
    )  # fmt: skip
    if result.exit_code != 0:
        print(f"{label}: worker failed with exit code {result.exit_code}; see {log}")
        return None
    if result.kills < kills:
        print(
            f"{label}: the job finished after {result.kills} of {kills} SIGKILLs (it outran "
            "them): run with more events"
        )
        return None
    print(
        f"{label}: job finished in {result.elapsed:.1f}s after {result.kills} SIGKILLs "
        f"({result.runs} runs)"
    )
    return result


def make_workdir(chosen: Path | None) -> Path:
    """Make a fresh work directory: ``chosen``, else ``./.demo``, else one in the temp dir."""
    candidates = (
        [chosen]
        if chosen is not None
        else [Path(".demo"), Path(tempfile.gettempdir()) / "aiostream-demo"]
    )
    tried: list[str] = []
    for candidate in candidates:
        work = candidate.resolve()
        shutil.rmtree(work, ignore_errors=True)
        try:
            work.mkdir(parents=True)
        except OSError as exc:
            tried.append(f"{work}: {exc.strerror or exc}")
            continue
        return work
    raise ConfigError(f"no writable demo directory ({'; '.join(tried)}): pass --workdir")


def worker_env() -> dict[str, str]:
    """Return the environment minus ``AIOSTREAM_*``: the worker is configured by --set."""
    return {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}


def _say(label: str) -> Callable[[str], None]:
    def say(line: str) -> None:
        print(f"{label}: {line}", flush=True)

    return say


def _stop_on_sigterm() -> None:
    """SIGTERM ends the demo like Ctrl-C (PID 1 ignores a signal it has no handler for)."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def _prove_table(cmd: list[str], work: Path, *, use_spark: bool) -> bool:
    """Prove the table against a failure-free run: by Spark when it can run, else without."""
    sets = [v for flag, v in itertools.pairwise(cmd) if flag == "--set"]
    skipped = spark_unavailable() if use_spark else "--no-spark"
    if skipped is not None:
        print(f"demo: spark proof skipped ({skipped}): the proof runs without Spark")
    run = AppRun("apps.pv_count", sets)
    report = prove(
        run, load_contract(run.module), work / "proof", spark=skipped is None, reference_runs=1
    )
    print_report(report, work / "proof.json")
    return report.passed


def demo_main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    _stop_on_sigterm()
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    work = make_workdir(args.workdir)
    print(f"demo: working in {work}")
    inputs = [work / f"events-{i}.jsonl" for i in range(args.parallelism)]
    per_file = args.events // len(inputs)
    print(f"demo: generating {args.events:,} events over {args.keys:,} app_ids (seed {seed})")
    for i, path in enumerate(inputs):
        n = per_file + (args.events - per_file * len(inputs) if i == 0 else 0)
        write_generated_jsonl(path, n, seed=seed + i, keys=args.keys)
    with open(inputs[0], "ab") as f:
        for i in range(MALFORMED_LINES):
            f.write(b'{"app_id": "app-1", oops %d\n' % i)
    output = work / "output"
    cmd = [
        sys.executable,
        "-m",
        "aiostream_ckpt.daemon.cli",
        "run",
        "apps.pv_count",
        "--set",
        f"checkpoint.dir={work / 'checkpoints'}",
        "--set",
        f"checkpoint.interval={args.interval}",
        "--set",
        f"job.parallelism={args.parallelism}",
        "--set",
        f"app.input={','.join(str(p) for p in inputs)}",
        "--set",
        f"app.output={output}",
        "--set",
        f"app.sink={args.sink}",
        "--set",
        "rest.port=0",
        "--progress",
        "1",
    ]

    result = run_demo_worker(
        "demo", cmd, kills=args.kills, seed=seed, work=work, inputs=inputs, env=worker_env()
    )
    if result is None:
        return 1
    if args.sink == "files":
        verdict = check_pv_count(
            inputs, output, use_spark=not args.no_spark, work=work, echo=_say("demo")
        )
    else:
        verdict = python_recount(inputs, output)
    print(verdict.report)
    if args.sink != "files" and not _prove_table(cmd, work, use_spark=not args.no_spark):
        print(f"exactly-once FAILED: the {args.sink} output differs from a failure-free run")
        return 1
    windowed = (
        args.windowed_kills == 0
        or prove_windowed("demo", work / "windowed", seed, kills=args.windowed_kills).passed
    )
    if not verdict.passed or not windowed:
        print("exactly-once FAILED: " + (verdict.summary if not verdict.passed else "windowed app"))
        return 1
    print(verified_line(verdict.events, verdict.keys, result.kills, args.windowed_kills))
    return 0
