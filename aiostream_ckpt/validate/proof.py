"""The reference-run proof: committed output under failures equals a failure-free run.

For a deterministic app, exactly-once means the multiset of committed records
equals the multiset a failure-free run of the same app, on the same input and
config, produces. :func:`reference_run` runs the app once, embedded, into a
scratch directory; :func:`compare` sets the two outputs side by side:

- ``duplicated``: a record committed more often than the reference has it;
- ``missing``: a record the reference has more often than the output;
- ``unexpected``: a record the reference never produced;
- ``reordered_keys``: keys whose records, in commit order, come in another
  order than the reference's (only where the app declares a ``key``).

This is the fast path: plain Python, no Spark, and it shares no code with the
sinks it checks. Files are listed, ordered and parsed here from the directory
itself (visible ``*.jsonl`` files, in the order of the numbers in their names:
checkpoint, then subtask), never through :mod:`aiostream_ckpt.connectors`.
Records are compared in a canonical form (sorted keys, ignored fields
dropped), so two runs need not serialize fields in the same order.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from aiostream_ckpt.api.contract import ProofContract
from aiostream_ckpt.validate.errors import ValidationConfigError
from aiostream_ckpt.validate.parse import canonical
from aiostream_ckpt.validate.result import CheckResult

_NUMBERS = re.compile(r"\d+")
MAX_EXAMPLES = 20


@dataclass
class ComparedOutput:
    """One output of the job under proof and where the reference run put its twin."""

    label: str
    actual: Path
    reference: Path


@dataclass
class Record:
    """A committed record in canonical form, and where it was committed."""

    canon: bytes
    key: Any
    at: str
    parsed: bool = True


def output_files(directory: Path) -> list[Path]:
    """Visible ``*.jsonl`` files of ``directory`` in commit order (numbers in their names).

    Hidden names (``.``/``_``: staged, not committed) and subdirectories are
    not output. A missing directory holds no output.
    """
    if not directory.is_dir():
        return []
    files = [
        p
        for p in directory.iterdir()
        if p.name.endswith(".jsonl") and not p.name.startswith((".", "_")) and p.is_file()
    ]
    return sorted(files, key=lambda p: ([int(n) for n in _NUMBERS.findall(p.name)], p.name))


def output_bytes(directories: Iterable[Path]) -> int:
    return sum(f.stat().st_size for d in directories for f in output_files(d))


def read_records(
    directory: Path, key: str | None = None, ignore: Sequence[str] = ()
) -> Iterator[Record]:
    """Yield the committed records of ``directory`` in commit order, located as ``file:line``."""
    for path in output_files(directory):
        with open(path, "rb") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                canon, k, ok = canonical(line, key, ignore)
                yield Record(canon, k, f"{path.name}:{n}", ok)


@dataclass
class Comparison:
    """The counts and examples of one output compared with its reference."""

    counts: dict[str, int]
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not any(v for k, v in self.counts.items() if k not in _INFORMATIONAL)


_INFORMATIONAL = ("records_out", "reference_records")


def compare(
    actual: Iterable[Record],
    reference: Iterable[Record],
    *,
    ordered: bool = False,
    max_examples: int = MAX_EXAMPLES,
) -> Comparison:
    """Compare as multisets; with ``ordered``, also each key's sequence of records."""
    ref_count: Counter[bytes] = Counter()
    ref_seq: dict[Any, list[bytes]] = defaultdict(list)
    for r in reference:
        ref_count[r.canon] += 1
        if ordered and r.key is not None:
            ref_seq[_hashable(r.key)].append(r.canon)
    seen: Counter[bytes] = Counter()
    act_seq: dict[Any, list[tuple[bytes, str]]] = defaultdict(list)
    examples: dict[str, list[dict[str, Any]]] = defaultdict(list)
    first_at: dict[bytes, str] = {}
    dup = unexpected = malformed = records = 0
    for r in actual:
        records += 1
        seen[r.canon] += 1
        if not r.parsed:
            malformed += 1
            _example(examples, "malformed_out", max_examples, record=_text(r.canon), at=r.at)
        if ordered and r.key is not None:
            act_seq[_hashable(r.key)].append((r.canon, r.at))
        n, expected = seen[r.canon], ref_count.get(r.canon, 0)
        if expected == 0:
            unexpected += 1
            _example(examples, "unexpected", max_examples, record=_text(r.canon), at=r.at)
        elif n > expected:
            dup += 1
            _example(
                examples,
                "duplicated",
                max_examples,
                record=_text(r.canon),
                at=r.at,
                earlier_at=first_at.get(r.canon),
            )
        first_at.setdefault(r.canon, r.at)
    missing = 0
    for canon, expected in ref_count.items():
        short = expected - seen.get(canon, 0)
        if short > 0:
            missing += short
            _example(examples, "missing", max_examples, record=_text(canon), times=short)
    reordered = 0
    if ordered:
        for k, seq in act_seq.items():
            want = ref_seq.get(k, [])
            got = [c for c, _ in seq]
            if got == want or Counter(got) != Counter(want):
                continue  # equal, or already counted as duplicated/missing/unexpected
            reordered += 1
            i = next(i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b)
            _example(
                examples,
                "reordered_keys",
                max_examples,
                key=k,
                index=i,
                got=_text(got[i]),
                expected=_text(want[i]),
                at=seq[i][1],
            )
    counts = {
        "records_out": records,
        "reference_records": sum(ref_count.values()),
        "duplicated": dup,
        "missing": missing,
        "unexpected": unexpected,
        "reordered_keys": reordered,
        "malformed_out": malformed,
    }
    return Comparison(counts, dict(examples))


def compare_dirs(
    actual: Path, reference: Path, contract: ProofContract, *, max_examples: int = MAX_EXAMPLES
) -> Comparison:
    key, ignore = contract.key, contract.ignore_fields
    return compare(
        read_records(actual, key, ignore),
        read_records(reference, key, ignore),
        ordered=key is not None,
        max_examples=max_examples,
    )


def compare_oracle(
    actual: Path, expected: Iterable[dict[str, Any]], contract: ProofContract
) -> Comparison:
    """Compare ``actual`` with records an independent recount says the input gives."""
    ignore = contract.ignore_fields
    oracle = (Record(canonical(orjson.dumps(e), None, ignore)[0], None, "oracle") for e in expected)
    return compare(read_records(actual, None, ignore), oracle)


def to_result(label: str, comparison: Comparison, seconds: float, notes: list[str]) -> CheckResult:
    return CheckResult(
        check=label,
        passed=comparison.passed,
        counts=comparison.counts,
        examples=comparison.examples,
        notes=notes,
        seconds=round(seconds, 3),
    )


def fast_results(outputs: Sequence[ComparedOutput], contract: ProofContract) -> list[CheckResult]:
    results = []
    for out in outputs:
        started = time.monotonic()
        comparison = compare_dirs(out.actual, out.reference, contract)
        notes = [
            f"{out.actual} ({len(output_files(out.actual))} files) vs reference "
            f"{out.reference} ({len(output_files(out.reference))} files)"
        ]
        results.append(to_result(out.label, comparison, time.monotonic() - started, notes))
    return results


# -- the reference run ---------------------------------------------------------------


@dataclass
class AppRun:
    """How the job under proof was configured: the same ``--config``/``--set`` as its run."""

    module: str
    sets: list[str]
    config: Path | None = None


def load_contract(module: str, *, assume_deterministic: bool = False) -> ProofContract:
    """Return the app's ``PROOF``; refuse an app that makes no (or a refusing) declaration."""
    from aiostream_ckpt.daemon.app_loader import import_app

    declared = getattr(import_app(module), "PROOF", None)
    if declared is None:
        if not assume_deterministic:
            raise ValidationConfigError(
                f"app {module!r} declares no PROOF = ProofContract(...): the proof compares "
                "with a failure-free run, which only means something for a deterministic app; "
                "declare it in the module (or pass --deterministic to assert it)"
            )
        declared = ProofContract()
    if not isinstance(declared, ProofContract):
        raise ValidationConfigError(f"app {module!r}: PROOF is not a ProofContract")
    refusal = declared.refusal()
    if refusal is not None:
        raise ValidationConfigError(f"app {module!r} cannot be proven: {refusal}")
    return declared


def plan_outputs(run: AppRun, contract: ProofContract, scratch: Path) -> list[ComparedOutput]:
    """Pair each declared output (and the dead letters) with its place in ``scratch``."""
    from aiostream_ckpt.daemon.config import load_config

    loaded = load_config(run.config, env=os.environ, sets=run.sets)
    plan = []
    for param in contract.outputs:
        if param in loaded.params:
            actual = Path(str(loaded.params[param]))
            plan.append(ComparedOutput(param, actual, scratch / f"out-{param}"))
    if not plan or contract.outputs[0] not in loaded.params:
        raise ValidationConfigError(
            f"the main output app.{contract.outputs[0]} is not set (--output or --set)"
        )
    errors = loaded.job.errors
    if contract.dead_letters and loaded.job.checkpoint.directory is not None:
        actual_dl = errors.dead_letter_dir or loaded.job.checkpoint.directory / "dead-letter"
        uids = {p.name for d in (actual_dl,) if d.is_dir() for p in d.iterdir() if p.is_dir()}
        for uid in sorted(uids):
            plan.append(
                ComparedOutput(f"dead-letter/{uid}", actual_dl / uid, scratch / "dead-letter" / uid)
            )
    return plan


def reference_run(run: AppRun, contract: ProofContract, scratch: Path) -> float:
    """Run the app once, failure-free and embedded, writing every output under ``scratch``.

    Same config as the run under proof, except where output and checkpoints
    go. Returns the seconds it took.
    """
    from aiostream_ckpt.api.environment import StreamEnvironment
    from aiostream_ckpt.daemon.app_loader import build_app
    from aiostream_ckpt.daemon.config import load_config
    from aiostream_ckpt.runtime.job import JobStatus, run_job

    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    sets = [
        *run.sets,
        f"checkpoint.dir={scratch / 'checkpoints'}",
        f"errors.dead_letter_dir={scratch / 'dead-letter'}",
    ]
    loaded = load_config(run.config, env=os.environ, sets=sets)
    sets += [f"app.{p}={scratch / f'out-{p}'}" for p in contract.outputs if p in loaded.params]
    loaded = load_config(run.config, env=os.environ, sets=sets)
    name = loaded.job_name or run.module.rsplit(".", 1)[-1].removesuffix(".py")
    env = StreamEnvironment(name, config=loaded.job, params=loaded.params)
    build_app(run.module, env)
    started = time.monotonic()
    result = run_job(env)
    if result.status is not JobStatus.FINISHED:
        raise ValidationConfigError(f"the reference run ended {result.status.value}")
    return time.monotonic() - started


def _example(examples: dict[str, list[dict[str, Any]]], kind: str, limit: int, **ex: Any) -> None:
    if len(examples[kind]) < limit:
        examples[kind].append(ex)


def _text(canon: bytes) -> str:
    return canon.decode("utf-8", errors="replace")


def _hashable(v: Any) -> Any:
    return v if isinstance(v, str | int | float | bool) else orjson.dumps(v)
