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
checkpoint, then subtask), never through :mod:`aiostream_ckpt.connectors`;
a Delta table or a directory of Parquet part files is read as its readers see
it (:mod:`.tables`: delta-rs's newest snapshot, or the visible ``*.parquet``);
an app in Kafka mode (``ProofContract.kafka_outputs``) is proven on its topics,
read as a ``read_committed`` consumer sees them (:mod:`.proof_kafka`).
Records are compared in a canonical form (sorted keys, ignored fields
dropped), so two runs need not serialize fields in the same order.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from aiostream_ckpt.api.contract import ProofContract
from aiostream_ckpt.objectstore import is_object_url
from aiostream_ckpt_dev.validate.errors import ValidationConfigError
from aiostream_ckpt_dev.validate.parse import canonical
from aiostream_ckpt_dev.validate.proof_kafka import (
    KafkaTopic,
    app_topic,
    new_twin,
    read_committed,
    registry_of,
    with_registry,
)
from aiostream_ckpt_dev.validate.result import CheckResult
from aiostream_ckpt_dev.validate.tables import (
    delta_files,
    is_delta_table,
    parquet_files,
    shard_directories,
    table_records,
)

_NUMBERS = re.compile(r"\d+")
MAX_EXAMPLES = 20


@dataclass(frozen=True)
class ObjectOutput:
    """A file sink's ``s3://bucket/prefix``: its committed objects are the output."""

    url: str

    def __str__(self) -> str:
        return self.url


#: Where an output is: a file sink's directory or prefix, or a Kafka topic (:mod:`.proof_kafka`).
Location = Path | KafkaTopic | ObjectOutput


def read_object_records(
    url: str, key: str | None = None, ignore: Sequence[str] = ()
) -> Iterator[Record]:
    """Yield the committed records of the objects under ``url`` in commit order."""
    from aiostream_ckpt.connectors.object_sink import committed_objects

    for name, data in committed_objects(url):
        for n, line in enumerate(data.splitlines(), 1):
            if line.strip():
                canon, k, ok = canonical(line, key, ignore)
                yield canon, k, ok, f"{name}:{n}"


def local_copy(url: str) -> Path:
    """Download the committed objects under ``url`` into a temp dir (Spark reads files)."""
    import tempfile

    from aiostream_ckpt.connectors.object_sink import committed_objects

    directory = Path(tempfile.mkdtemp(prefix="aiostream-proof-"))
    for name, data in committed_objects(url):
        (directory / name.rpartition("/")[2]).write_bytes(data)
    return directory


@dataclass
class ComparedOutput:
    """One output of the job under proof and where the reference run put its twin."""

    label: str
    actual: Location
    reference: Location


#: A committed record: canonical form, key value (None: no key), parsed as JSON, ``file:line``.
Record = tuple[str, Any, bool, str]
#: Reads the records of one side again (examples need a second look at a few).
Records = Callable[[], Iterable[Record]]


def output_files(directory: Path) -> list[Path]:
    """Visible ``*.jsonl`` files of ``directory`` in commit order (numbers in their names).

    Hidden names (``.``/``_``: staged, not committed) are not output, nor are
    subdirectories, but for a sharded job's ``shard-I-of-N`` ones (every
    shard's, of every layout it ran in). A missing directory holds no output.
    """
    files = [
        p
        for d in shard_directories(directory)
        for p in d.iterdir()
        if p.name.endswith(".jsonl") and not p.name.startswith((".", "_")) and p.is_file()
    ]
    return sorted(files, key=lambda p: ([int(n) for n in _NUMBERS.findall(p.name)], p.name))


def output_bytes(directories: Iterable[Path]) -> int:
    return sum(f.stat().st_size for d in directories for f in _data_files(d))


def _data_files(directory: Path) -> list[Path]:
    """List the committed data files: a Delta table's, visible Parquet ones, or JSON lines."""
    if is_delta_table(directory):
        return [directory / p for p, _ in delta_files(directory)]
    return parquet_files(directory) or output_files(directory)


def read_records(
    directory: Path, key: str | None = None, ignore: Sequence[str] = ()
) -> Iterator[Record]:
    """Yield the committed records of ``directory`` in commit order."""
    table = table_records(directory)
    if table is not None:
        for rec, where in table:
            canon, k, ok = canonical(orjson.dumps(rec), key, ignore)
            yield canon, k, ok, where
        return
    for path in output_files(directory):
        name = str(path.relative_to(directory))
        with open(path, "rb") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    canon, k, ok = canonical(line, key, ignore)
                    yield canon, k, ok, f"{name}:{n}"


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
    actual: Records,
    reference: Records,
    *,
    key: str | None = None,
    max_examples: int = MAX_EXAMPLES,
) -> Comparison:
    """Compare as multisets; with a ``key`` field, also each key's sequence of records.

    One pass over each side holds the reference's distinct records and, per
    key, a digest of its records in order on each side; a second look at
    either side is taken only to give examples of what failed.
    """
    ordered = key is not None
    remaining: Counter[str] = Counter()
    ref_digest: dict[Any, int] = {}
    for canon, k, _, _ in reference():
        remaining[canon] += 1
        if ordered and k is not None:
            hk = _hashable(k)
            ref_digest[hk] = hash((ref_digest.get(hk, 0), canon))
    reference_records = remaining.total()
    act_digest: dict[Any, int] = {}
    unequal: set[Any] = set()  # keys whose multisets differ: not also "reordered"
    examples: dict[str, list[dict[str, Any]]] = defaultdict(list)
    dup_canons: set[str] = set()
    dup = unexpected = malformed = records = 0
    for canon, k, parsed, at in actual():
        records += 1
        if not parsed:
            malformed += 1
            _example(examples, "malformed_out", max_examples, record=canon, at=at)
        left = remaining.get(canon)
        if left is None:
            unexpected += 1
            _example(examples, "unexpected", max_examples, record=canon, at=at)
            unequal.add(_hashable(k))
        else:
            remaining[canon] = left - 1
            if left <= 0:
                dup += 1
                if len(examples["duplicated"]) < max_examples:
                    examples["duplicated"].append({"record": canon, "at": at})
                    dup_canons.add(canon)
                unequal.add(_hashable(k))
        if ordered and k is not None:
            hk = _hashable(k)
            act_digest[hk] = hash((act_digest.get(hk, 0), canon))
    if dup_canons:  # where each was committed first
        first: dict[str, str] = {}
        for canon, _, _, at in actual():
            if canon in dup_canons:
                first.setdefault(canon, at)
        for ex in examples["duplicated"]:
            ex["earlier_at"] = first.get(ex["record"])
    missing = 0
    for canon, left in remaining.items():
        if left > 0:
            missing += left
            _example(examples, "missing", max_examples, record=canon, times=left)
            if ordered:
                unequal.add(_hashable(_key_of(canon, key)))
    reordered_keys = [
        k
        for k in ref_digest.keys() | act_digest.keys()
        if ref_digest.get(k) != act_digest.get(k) and k not in unequal
    ]
    if reordered_keys:
        examples["reordered_keys"] = _first_differences(
            actual, reference, set(reordered_keys[:max_examples])
        )
    counts = {
        "records_out": records,
        "reference_records": reference_records,
        "duplicated": dup,
        "missing": missing,
        "unexpected": unexpected,
        "reordered_keys": len(reordered_keys),
        "malformed_out": malformed,
    }
    return Comparison(counts, {k: v for k, v in examples.items() if v})


def _first_differences(actual: Records, reference: Records, keys: set[Any]) -> list[dict[str, Any]]:
    """For each of ``keys``, the first place its records differ in commit order."""
    seqs: list[dict[Any, list[tuple[str, str]]]] = [defaultdict(list), defaultdict(list)]
    for side, records in enumerate((actual, reference)):
        for canon, k, _, at in records():
            if k is not None and (hk := _hashable(k)) in keys:
                seqs[side][hk].append((canon, at))
    out = []
    for k in sorted(keys, key=str):
        got, want = seqs[0][k], seqs[1][k]
        i = next(i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a[0] != b[0])
        out.append(
            {
                "key": k,
                "index": i,
                "got": got[i][0],
                "expected": want[i][0],
                "at": got[i][1],
            }
        )
    return out


def records_of(where: Location, key: str | None, ignore: Sequence[str]) -> Records:
    """Return a reader of the committed records: a directory's on each call, a topic's once."""
    if isinstance(where, KafkaTopic):
        records = read_committed(where, key, ignore)
        return lambda: records
    if isinstance(where, ObjectOutput):
        return lambda: read_object_records(where.url, key, ignore)
    return lambda: read_records(where, key, ignore)


def compare_dirs(
    actual: Location,
    reference: Location,
    contract: ProofContract,
    *,
    max_examples: int = MAX_EXAMPLES,
) -> Comparison:
    """Compare two outputs: directories of committed files, or topics read read_committed."""
    key, ignore = contract.key, contract.ignore_fields
    return compare(
        records_of(actual, key, ignore),
        records_of(reference, key, ignore),
        key=key,
        max_examples=max_examples,
    )


def describe(where: Location) -> str:
    if isinstance(where, KafkaTopic):
        return f"{where} (read_committed)"
    if isinstance(where, ObjectOutput):
        return f"{where} (committed objects)"
    kind = " Delta table," if is_delta_table(where) else ""
    return f"{where} ({kind} {len(_data_files(where))} files)".replace("( ", "(")


def compare_oracle(
    actual: Location, expected: Iterable[dict[str, Any]], contract: ProofContract
) -> Comparison:
    """Compare ``actual`` (a directory or a topic) with what an independent recount expects."""
    ignore = contract.ignore_fields
    oracle = [(canonical(orjson.dumps(e), None, ignore)[0], None, True, "oracle") for e in expected]
    return compare(records_of(actual, None, ignore), lambda: oracle)


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
        notes = [f"{describe(out.actual)} vs reference {describe(out.reference)}"]
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
    """Pair each declared output (and the dead letters) with its place in ``scratch``.

    Call it again after the reference run: dead-letter directories are found
    on both sides.
    """
    from aiostream_ckpt.daemon.config import load_config

    loaded = load_config(run.config, env=os.environ, sets=run.sets)
    plan: list[ComparedOutput] = []
    bootstrap = kafka_bootstrap(contract, loaded.params)
    outputs = contract.kafka_outputs if bootstrap is not None else contract.outputs
    twins = reference_topics(scratch)
    for param in outputs:
        if param not in loaded.params:
            continue
        if bootstrap is not None:
            topic = app_topic(contract, loaded.params, bootstrap, param)
            # before the reference run, its topic is not made yet
            plan.append(ComparedOutput(param, topic, twins.get(param, KafkaTopic(bootstrap, ""))))
        elif is_object_url(str(loaded.params[param])):
            where = ObjectOutput(str(loaded.params[param]))
            plan.append(ComparedOutput(param, where, scratch / f"out-{param}"))
        else:
            path = Path(str(loaded.params[param]))
            plan.append(ComparedOutput(param, path, scratch / f"out-{param}"))
    if not plan or outputs[0] not in loaded.params:
        raise ValidationConfigError(
            f"the main output app.{outputs[0]} is not set (--output or --set)"
        )
    errors = loaded.job.errors
    if contract.dead_letters and loaded.job.checkpoint.directory is not None:
        actual_dl = errors.dead_letter_dir or loaded.job.checkpoint.directory / "dead-letter"
        # every source with dead letters on either side: one side without any is a loss
        sides = (actual_dl, scratch / "dead-letter")
        uids = {p.name for d in sides if d.is_dir() for p in d.iterdir() if p.is_dir()}
        for uid in sorted(uids):
            plan.append(
                ComparedOutput(f"dead-letter/{uid}", actual_dl / uid, scratch / "dead-letter" / uid)
            )
    return plan


def reference_run(run: AppRun, contract: ProofContract, scratch: Path) -> float:
    """Run the app once, failure-free and embedded, writing every output under ``scratch``.

    Same config as the run under proof, except where output and checkpoints
    go, and in this one process (``job.workers=1``: an embedded run has no app
    module to start workers from; the parallelism, hence the output, is the
    same). Returns the seconds it took.
    """
    from aiostream_ckpt.api.environment import StreamEnvironment
    from aiostream_ckpt.daemon.app_loader import build_app
    from aiostream_ckpt.daemon.config import load_config
    from aiostream_ckpt.runtime.job import JobStatus, run_job

    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    sets = [
        # a local checkpoint.dir here: the local copy of an object-store one has no meaning
        *(s for s in run.sets if s.partition("=")[0].strip() != "checkpoint.local_dir"),
        f"checkpoint.dir={scratch / 'checkpoints'}",
        f"errors.dead_letter_dir={scratch / 'dead-letter'}",
        "job.workers=1",
    ]
    loaded = load_config(run.config, env=os.environ, sets=sets)
    name = loaded.job_name or run.module.rsplit(".", 1)[-1].removesuffix(".py")
    bootstrap = kafka_bootstrap(contract, loaded.params)
    if bootstrap is not None:
        # a topic per output, and a job name of its own: the sink's transactional ids
        # ({job name}-{uid}) must not fence the run under proof's
        topics = {
            p: new_twin(app_topic(contract, loaded.params, bootstrap, p), "reference")
            for p in contract.kafka_outputs
            if p in loaded.params
        }
        record_topics(scratch, bootstrap, topics)
        name = f"{name}-reference-{os.getpid()}-{int(time.time() * 1000)}"
        sets += [f"app.{p}={t.topic}" for p, t in topics.items()] + [f"job.name={name}"]
    else:
        sets += [f"app.{p}={scratch / f'out-{p}'}" for p in contract.outputs if p in loaded.params]
    loaded = load_config(run.config, env=os.environ, sets=sets)
    env = StreamEnvironment(name, config=loaded.job, params=loaded.params)
    build_app(run.module, env)
    started = time.monotonic()
    result = run_job(env.spec())
    if result.status is not JobStatus.FINISHED:
        raise ValidationConfigError(f"the reference run ended {result.status.value}")
    return time.monotonic() - started


_TOPICS = "kafka-topics.json"


def kafka_bootstrap(contract: ProofContract, params: Mapping[str, Any]) -> str | None:
    """Return where the proof reads in Kafka mode (the outputs are topics), else None.

    The app's bootstrap servers, or the param ``contract.kafka_proof_bootstrap``
    names when set (another listener of the same cluster: the app's needs TLS/SASL).
    """
    if contract.kafka_outputs and params.get(contract.kafka_bootstrap):
        return str(params.get(contract.kafka_proof_bootstrap) or params[contract.kafka_bootstrap])
    return None


def record_topics(directory: Path, bootstrap: str, topics: Mapping[str, KafkaTopic]) -> None:
    """Note in ``directory`` the topics made for it, by param (:func:`reference_topics`)."""
    names: dict[str, Any] = {"_bootstrap": bootstrap, **{p: t.topic for p, t in topics.items()}}
    registries = {registry_of(t) for t in topics.values()} - {None}
    if registries:  # Avro topics: the reader of the twins decodes as the app's
        names["_avro_registry"] = registries.pop()
    (directory / _TOPICS).write_bytes(orjson.dumps(names))


def reference_topics(scratch: Path) -> dict[str, KafkaTopic]:
    """Return the topics :func:`reference_run` made for a Kafka-mode app, by param."""
    try:
        names = orjson.loads((scratch / _TOPICS).read_bytes())
    except FileNotFoundError:
        return {}
    bootstrap = str(names.pop("_bootstrap", ""))
    registry = names.pop("_avro_registry", None)
    return {p: with_registry(KafkaTopic(bootstrap, t), registry) for p, t in names.items()}


#: Label prefix of the comparison of the two failure-free runs.
DETERMINISM = "determinism:"


def twin_outputs(
    run: AppRun, contract: ProofContract, first: Path, second: Path
) -> list[ComparedOutput]:
    """Pair each output of two failure-free runs (scratch dirs ``first`` and ``second``).

    The proof compares with one failure-free run, so it means something only
    if a second one commits the same records: an app that reads processing
    time, random numbers or a live service shows it here, whatever it declares.
    """
    a = plan_outputs(run, contract, first)
    b = {o.label: o.reference for o in plan_outputs(run, contract, second)}
    labels = [o.label for o in a] + sorted(b.keys() - {o.label for o in a})
    firsts = {o.label: o.reference for o in a}
    return [
        ComparedOutput(
            f"{DETERMINISM} {label}",
            firsts.get(label, first / "dead-letter" / label.split("/", 1)[-1]),
            b[label] if label in b else second / "dead-letter" / label.split("/", 1)[-1],
        )
        for label in labels
    ]


def assumptions(contract: ProofContract, reference_runs: int, *, oracle: bool = False) -> list[str]:
    """Return what a PASS rests on, in words for the report."""
    said = "its PROOF declares it" if contract.deterministic else "it declares which fields vary"
    ignored = (
        f", apart from the fields {list(contract.ignore_fields)} (compared as absent)"
        if contract.ignore_fields
        else ""
    )
    return [
        f"the app is deterministic ({said}): the same input and config commit the same "
        f"records{ignored}",
        "checked: a second failure-free run committed the same records (nondeterminism "
        "that did not show in two runs is not caught)"
        if reference_runs > 1
        else "not checked: one reference run only (--reference-runs 1)",
        "the failure-free reference run is itself right: a fault it shares with the run "
        "under proof is not seen"
        + ("; the app's independent recount (oracle) checks the main output" if oracle else ""),
        f"records are compared as multisets and each {contract.key!r}'s records in commit order"
        if contract.key is not None
        else "records are compared as multisets only (the app declares no key, so order is "
        "not checked)",
    ]


def nondeterminism_note(result: CheckResult) -> None:
    """Say plainly what a failed twin comparison means."""
    if result.check.startswith(DETERMINISM) and not result.passed:
        result.notes.insert(
            0,
            "NOT DETERMINISTIC: two failure-free runs on the same input committed different "
            "records, so a comparison with a reference run proves nothing for this app; fix "
            "it, or declare deterministic=False and the fields that vary (ignore_fields)",
        )


def _example(examples: dict[str, list[dict[str, Any]]], kind: str, limit: int, **ex: Any) -> None:
    if len(examples[kind]) < limit:
        examples[kind].append(ex)


def _key_of(canon: str, key: str | None) -> Any:
    try:
        obj = orjson.loads(canon)
    except orjson.JSONDecodeError:
        return None
    return obj.get(key) if isinstance(obj, dict) and key is not None else None


def _hashable(v: Any) -> Any:
    return v if isinstance(v, str | int | float | bool) else orjson.dumps(v)
