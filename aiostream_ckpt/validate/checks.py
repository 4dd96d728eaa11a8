"""The exactly-once checks: recompute from the input, compare with committed output.

Every output record gets at most one failure *kind*, tried in this order:
``unexpected`` (its key is not in the input, or its value is outside what the
input allows), ``duplicate`` (the same value was committed earlier for the
key), ``out_of_order`` (a larger value was committed earlier for the key).
``missing`` values and ``mismatched`` keys (final value differs) come from the
input side. A record that does not parse is ``malformed_out``. Counts are
computed in one Spark pass per side; examples are fetched only for failures.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from aiostream_ckpt.validate import parse
from aiostream_ckpt.validate.readers import OutputSource, read_input
from aiostream_ckpt.validate.result import CheckResult

MAX_EXAMPLES = 20
_ORDER = ("o1", "o2", "o3")


def pv_count_check(
    spark: Any,
    input_paths: Sequence[str | os.PathLike[str]],
    output: OutputSource,
    *,
    key_field: str = "app_id",
    count_field: str = "pv",
    max_examples: int = MAX_EXAMPLES,
) -> CheckResult:
    """Check a running count per key: per key the committed values are exactly 1..n.

    ``n`` is the number of valid input events with that key (a JSON object whose
    ``key_field`` is a string); malformed lines are expected to be dead-lettered.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    started = time.monotonic()
    inp = read_input(spark, input_paths, key_field=key_field)
    valid = (F.col("status") == parse.OK) & F.col("key").isNotNull()
    by_key = inp.groupBy("key", valid.alias("valid"), "status").count().cache()
    stats = by_key.agg(
        F.sum(F.when(F.col("status") != parse.BLANK, F.col("count"))).alias("events"),
        F.sum(F.when(F.col("valid"), F.col("count"))).alias("valid"),
        F.sum(F.when(F.col("status") == parse.BLANK, F.col("count"))).alias("blank"),
        F.count(F.when(F.col("valid"), 1)).alias("keys"),
    ).first()
    expected = by_key.where("valid").select("key", F.col("count").alias("expected"))

    parser = parse.udf(parse.count_parser(key_field, count_field), parse.COUNT_SCHEMA)
    out = (
        output.df.withColumn("p", parser("value"))
        .select("at", *_ORDER, "p.key", F.col("p.n").alias("pv"), "p.error")
        .cache()
    )
    # Both windows partition by key alone, so Spark shuffles once. In (pv, commit)
    # order a record whose predecessor has the same pv is a repeat of it.
    by_value = Window.partitionBy("key").orderBy("pv", *_ORDER)
    before = Window.partitionBy("key").orderBy(*_ORDER).rowsBetween(Window.unboundedPreceding, -1)
    good = (
        out.where(F.col("error").isNull())
        .join(expected, "key", "left")
        .withColumn("repeat", F.lag("pv").over(by_value) == F.col("pv"))
        .withColumn("earlier_at", F.lag("at").over(by_value))
        .withColumn("after_pv", F.max("pv").over(before))
    )
    kind = (
        F.when(
            F.col("expected").isNull() | (F.col("pv") < 1) | (F.col("pv") > F.col("expected")),
            "unexpected",
        )
        .when(F.col("repeat"), "duplicate")
        .when(F.col("after_pv") > F.col("pv"), "out_of_order")
    )
    records = good.withColumn("kind", kind).cache()
    bad_out = out.where(F.col("error").isNotNull())

    last = records.groupBy("key").agg(
        F.max_by("pv", F.struct(*_ORDER)).alias("last_pv"),
        F.max_by("at", F.struct(*_ORDER)).alias("at"),
    )
    mismatched = last.join(expected, "key", "full_outer").where(
        ~F.coalesce(F.col("last_pv"), F.lit(0)).eqNullSafe(F.coalesce(F.col("expected"), F.lit(0)))
    )
    missing = expected.select(
        "key", "expected", F.explode(F.sequence(F.lit(1), F.col("expected"))).alias("pv")
    ).join(records.select("key", "pv"), ["key", "pv"], "left_anti")

    kinds = _kind_counts(records)
    n_bad = bad_out.count()
    counts = {
        "events_in": _int(stats["events"]),
        "malformed_in": _int(stats["events"]) - _int(stats["valid"]),
        "records_out": sum(kinds.values()) + n_bad,
        "keys": _int(stats["keys"]),
        "duplicates": kinds.get("duplicate", 0),
        "missing": missing.count(),
        "mismatched": mismatched.count(),
        "out_of_order": kinds.get("out_of_order", 0),
        "unexpected": kinds.get("unexpected", 0),
        "malformed_out": n_bad,
    }
    record_cols = ["key", "pv", "at"]
    examples = _collect_examples(
        counts,
        max_examples,
        duplicates=lambda: records.where("kind = 'duplicate'").select(*record_cols, "earlier_at"),
        out_of_order=lambda: records.where("kind = 'out_of_order'").select(
            *record_cols, "after_pv"
        ),
        unexpected=lambda: records.where("kind = 'unexpected'").select(*record_cols, "expected"),
        missing=lambda: missing.select("key", "pv", "expected"),
        mismatched=lambda: mismatched.select("key", "expected", "last_pv", "at"),
        malformed_out=lambda: bad_out.select("at", "error"),
    )
    for df in (records, out, by_key):
        df.unpersist()
    notes = list(output.notes)
    if _int(stats["blank"]):
        notes.append(f"{_int(stats['blank'])} blank input lines skipped (not events)")
    return _result("pv_count", counts, examples, notes, started, informational=4)


def positions_check(
    spark: Any,
    input_paths: Sequence[str | os.PathLike[str]],
    output: OutputSource,
    *,
    pos_field: str = "_pos",
    require_field: str | None = None,
    max_examples: int = MAX_EXAMPLES,
) -> CheckResult:
    """Check that every valid input line's position is in the output exactly once.

    For apps whose output records carry ``[source, byte offset]`` of the input
    line they come from. A valid line is a JSON object (with a string
    ``require_field`` when given); sources are matched by file name.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    started = time.monotonic()
    inp = read_input(spark, input_paths, key_field=require_field or "", positions=True)
    valid = F.col("status") == parse.OK
    if require_field:
        valid &= F.col("key").isNotNull()
    inp = inp.withColumn("valid", valid).cache()
    stats = inp.agg(
        F.count(F.when(F.col("status") != parse.BLANK, 1)).alias("events"),
        F.count(F.when(F.col("valid"), 1)).alias("valid"),
    ).first()
    positions = inp.where("valid").select("src", "off", F.col("at").alias("input_at"))

    parser = parse.udf(parse.position_parser(pos_field), parse.POSITION_SCHEMA)
    out = (
        output.df.withColumn("p", parser("value"))
        .select("at", *_ORDER, "p.src", "p.off", "p.error")
        .cache()
    )
    per_pos = Window.partitionBy("src", "off").orderBy(*_ORDER)
    records = (
        out.where(F.col("error").isNull())
        .join(positions, ["src", "off"], "left")
        .withColumn("earlier_at", F.lag("at").over(per_pos))
        .withColumn(
            "kind",
            F.when(F.col("input_at").isNull(), "unexpected").when(
                F.col("earlier_at").isNotNull(), "duplicate"
            ),
        )
        .cache()
    )
    bad_out = out.where(F.col("error").isNotNull())
    missing = positions.join(records.select("src", "off"), ["src", "off"], "left_anti")

    kinds = _kind_counts(records)
    n_bad = bad_out.count()
    counts = {
        "events_in": _int(stats["events"]),
        "malformed_in": _int(stats["events"]) - _int(stats["valid"]),
        "records_out": sum(kinds.values()) + n_bad,
        "duplicates": kinds.get("duplicate", 0),
        "missing": missing.count(),
        "unexpected": kinds.get("unexpected", 0),
        "malformed_out": n_bad,
    }
    pos_cols = ["src", "off", "at"]
    examples = _collect_examples(
        counts,
        max_examples,
        duplicates=lambda: records.where("kind = 'duplicate'").select(
            *pos_cols, "earlier_at", "input_at"
        ),
        unexpected=lambda: records.where("kind = 'unexpected'").select(*pos_cols),
        missing=lambda: missing.select("src", "off", "input_at"),
        malformed_out=lambda: bad_out.select("at", "error"),
    )
    for df in (records, out, inp):
        df.unpersist()
    return _result("positions", counts, examples, list(output.notes), started, informational=3)


def _kind_counts(records: Any) -> dict[str | None, int]:
    """Count records per failure kind (None: fine) in one job."""
    return {r["kind"]: int(r["count"]) for r in records.groupBy("kind").count().collect()}


def _collect_examples(
    counts: dict[str, int], limit: int, **queries: Any
) -> dict[str, list[dict[str, Any]]]:
    """Run the example query of each failed category, in a stable order."""
    examples: dict[str, list[dict[str, Any]]] = {}
    for category, query in queries.items():
        if counts.get(category, 0) > 0 and limit > 0:
            df = query()
            rows = df.orderBy(*df.columns).limit(limit).collect()
            examples[category] = [r.asDict() for r in rows]
    return examples


def _result(
    check: str,
    counts: dict[str, int],
    examples: dict[str, list[dict[str, Any]]],
    notes: list[str],
    started: float,
    *,
    informational: int,
) -> CheckResult:
    """Build the result; the first ``informational`` counts describe, the rest are failures."""
    failures = list(counts.values())[informational:]
    return CheckResult(
        check=check,
        passed=not any(failures),
        counts=counts,
        examples=examples,
        notes=notes,
        seconds=round(time.monotonic() - started, 3),
    )


def _int(v: Any) -> int:
    return int(v) if v is not None else 0
