"""The exactly-once checks: recompute from the input, compare with committed output.

Every output record gets at most one failure *kind*, tried in this order:
``malformed_out`` (does not parse), ``unexpected`` (its key or position is
not in the input, or its value is outside what the input allows),
``duplicate`` (the same value or position was committed before),
``out_of_order`` (a larger value was committed before for the key).
``missing`` values and ``mismatched`` keys (final value differs) come from the
input side. Both checks take one Spark pass over each side plus cheap passes
over small cached results; examples are fetched only for failed categories.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiostream_ckpt_dev.validate import parse
from aiostream_ckpt_dev.validate.readers import ORDER, OutputSource, Place, read_input
from aiostream_ckpt_dev.validate.result import CheckResult

MAX_EXAMPLES = 20


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
    n_valid = _int(stats["valid"])
    expected = by_key.where("valid").select("key", F.col("count").alias("expected"))

    parser = parse.udf(parse.count_parser(key_field, count_field), parse.COUNT_SCHEMA)
    place = F.struct(*ORDER)
    # Both windows partition by key alone, so the output is shuffled once. In
    # (pv, commit) order, a record whose predecessor has the same pv repeats it.
    by_value = Window.partitionBy("key").orderBy("pv", *ORDER)
    before = Window.partitionBy("key").orderBy(*ORDER).rowsBetween(Window.unboundedPreceding, -1)
    kind = (
        F.when(F.col("error").isNotNull(), "malformed_out")
        .when(
            F.col("expected").isNull() | (F.col("pv") < 1) | (F.col("pv") > F.col("expected")),
            "unexpected",
        )
        .when(F.lag("pv").over(by_value) == F.col("pv"), "duplicate")
        .when(F.max("pv").over(before) > F.col("pv"), "out_of_order")
    )
    records = (
        output.df.select(*ORDER, parser("value").alias("p"))
        .select(*ORDER, "p.key", F.col("p.n").alias("pv"), "p.error")
        .join(expected, "key", "left")
        .select(
            "key",
            "pv",
            "expected",
            "error",
            place.alias("place"),
            F.lag(place).over(by_value).alias("earlier"),
            F.max("pv").over(before).alias("after_pv"),
            kind.alias("kind"),
        )
        .cache()
    )
    kinds = _kind_counts(records)
    good = records.where(F.col("error").isNull())
    last = good.groupBy("key").agg(
        F.max_by("pv", "place").alias("last_pv"), F.max("place").alias("place")
    )
    mismatched = last.join(expected, "key", "full_outer").where(
        F.coalesce(F.col("last_pv"), F.lit(0)) != F.coalesce(F.col("expected"), F.lit(0))
    )
    # Each record of kind None or out_of_order is the first commit of a value in
    # 1..n, so what they don't cover is missing; no need to list 1..n per key.
    covered = kinds.get(None, 0) + kinds.get("out_of_order", 0)
    counts = {
        "events_in": _int(stats["events"]),
        "malformed_in": _int(stats["events"]) - n_valid,
        "records_out": sum(kinds.values()),
        "keys": _int(stats["keys"]),
        "duplicates": kinds.get("duplicate", 0),
        "missing": n_valid - covered,
        "mismatched": mismatched.count(),
        "out_of_order": kinds.get("out_of_order", 0),
        "unexpected": kinds.get("unexpected", 0),
        "malformed_out": kinds.get("malformed_out", 0),
    }

    def missing() -> Any:
        first_commits = good.where(F.col("kind").isNull() | (F.col("kind") == "out_of_order"))
        short = (
            first_commits.groupBy("key")
            .count()
            .join(expected, "key", "right")
            .where(F.coalesce(F.col("count"), F.lit(0)) < F.col("expected"))
        )
        return short.select(
            "key", F.explode(F.sequence(F.lit(1), F.col("expected"))).alias("pv"), "expected"
        ).join(good.select("key", "pv"), ["key", "pv"], "left_anti")

    def of_kind(name: str, *cols: str) -> Callable[[], Any]:
        return lambda: records.where(F.col("kind") == name).select(*cols)

    examples = _collect_examples(
        counts,
        max_examples,
        output.locate,
        duplicates=of_kind("duplicate", "key", "pv", "place", "earlier"),
        out_of_order=of_kind("out_of_order", "key", "pv", "place", "after_pv"),
        unexpected=of_kind("unexpected", "key", "pv", "place", "expected"),
        missing=missing,
        mismatched=lambda: mismatched.select("key", "expected", "last_pv", "place"),
        malformed_out=of_kind("malformed_out", "place", "error"),
    )
    for df in (records, by_key):
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
    inp = inp.select(
        "src", "off", "line", valid.alias("valid"), (F.col("status") == parse.BLANK).alias("blank")
    ).cache()
    stats = inp.agg(
        F.count(F.when(~F.col("blank"), 1)).alias("events"),
        F.count(F.when(F.col("valid"), 1)).alias("valid"),
    ).first()
    n_valid = _int(stats["valid"])
    positions = inp.where("valid").select("src", "off", "line")

    parser = parse.udf(parse.position_parser(pos_field), parse.POSITION_SCHEMA)
    place = F.struct(*ORDER)
    per_pos = Window.partitionBy("src", "off").orderBy(*ORDER)
    kind = (
        F.when(F.col("error").isNotNull(), "malformed_out")
        .when(F.col("line").isNull(), "unexpected")
        .when(F.lag(place).over(per_pos).isNotNull(), "duplicate")
    )
    records = (
        output.df.select(*ORDER, parser("value").alias("p"))
        .select(*ORDER, "p.src", "p.off", "p.error")
        .join(positions, ["src", "off"], "left")
        .select(
            "src",
            "off",
            "error",
            F.concat_ws(":", "src", F.col("line").cast("string")).alias("input_at"),
            place.alias("place"),
            F.lag(place).over(per_pos).alias("earlier"),
            kind.alias("kind"),
        )
        .cache()
    )
    kinds = _kind_counts(records)
    counts = {
        "events_in": _int(stats["events"]),
        "malformed_in": _int(stats["events"]) - n_valid,
        "records_out": sum(kinds.values()),
        "duplicates": kinds.get("duplicate", 0),
        # Records of kind None are the first commit of each valid position.
        "missing": n_valid - kinds.get(None, 0),
        "unexpected": kinds.get("unexpected", 0),
        "malformed_out": kinds.get("malformed_out", 0),
    }

    def of_kind(name: str, *cols: str) -> Callable[[], Any]:
        return lambda: records.where(F.col("kind") == name).select(*cols)

    examples = _collect_examples(
        counts,
        max_examples,
        output.locate,
        duplicates=of_kind("duplicate", "src", "off", "place", "earlier", "input_at"),
        unexpected=of_kind("unexpected", "src", "off", "place"),
        missing=lambda: positions.join(records, ["src", "off"], "left_anti").select(
            "src", "off", F.concat_ws(":", "src", F.col("line").cast("string")).alias("input_at")
        ),
        malformed_out=of_kind("malformed_out", "place", "error"),
    )
    for df in (records, inp):
        df.unpersist()
    return _result("positions", counts, examples, list(output.notes), started, informational=3)


def _kind_counts(records: Any) -> dict[str | None, int]:
    """Count records per failure kind (None: fine) in one job."""
    return {r["kind"]: int(r["count"]) for r in records.groupBy("kind").count().collect()}


def _collect_examples(
    counts: dict[str, int],
    limit: int,
    locate: Callable[[Sequence[Place]], list[str]],
    **queries: Callable[[], Any],
) -> dict[str, list[dict[str, Any]]]:
    """Run the example query of each failed category, in a stable order.

    Columns holding a place (``place``, ``earlier``) become ``at`` and
    ``earlier_at`` strings naming the file and line or partition and offset.
    """
    examples: dict[str, list[dict[str, Any]]] = {}
    for category, query in queries.items():
        if counts.get(category, 0) <= 0 or limit <= 0:
            continue
        df = query()
        rows = [r.asDict() for r in df.orderBy(*df.columns).limit(limit).collect()]
        for col in ("place", "earlier"):
            if col not in df.columns:
                continue
            found = [i for i, r in enumerate(rows) if r[col] is not None]
            names = locate([tuple(int(v) for v in rows[i][col]) for i in found])  # type: ignore[misc]
            named = dict(zip(found, names, strict=True))
            label = "at" if col == "place" else f"{col}_at"
            for i, r in enumerate(rows):
                r[label] = named.get(i)
                del r[col]
        examples[category] = rows
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
