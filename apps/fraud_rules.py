"""Fraud rules: transactions keyed by account, checked against rules on a broadcast stream.

Transactions ``{"seq", "account", "amount", "ts"}`` are enriched with the
account's ``segment`` by an async lookup (``map_async``: the HTTP lookup
service at ``app.service``, or a simulated one), keyed by account, and
checked against the rules in force at their event time. Rules
``{"rule_id", "ts", "max_amount", "segment"}`` arrive on a second stream that
is broadcast to every instance and kept as broadcast state (every version of
a rule, by id); ``max_amount: null`` withdraws a rule from ``ts`` on. A rule
alerts on a transaction whose ``amount`` exceeds its ``max_amount`` (and whose
segment is the rule's, when the rule names one).

Each transaction waits in keyed state until the watermark (the minimum over
both streams) passes its time: by then every rule version up to that time has
arrived, so the output does not depend on how the two streams interleave, and
a run is deterministic (provable by ``aiostream-ckpt chaos``). The output, one
record per transaction: ``{"seq", "account", "amount", "ts", "segment",
"alerts": [rule ids], "account_alerts": alerting transactions of the account
so far}``.

Params: ``transactions``, ``rules`` (JSON-lines files), ``output``;
``service`` (lookup service URL) or ``simulate`` (seconds, default 0);
``capacity`` (lookups in flight, default 100); ``rate`` (transactions read per
second, unpaced by default). ``python -m apps.fraud_rules
DIR [N]`` writes sample inputs (``N`` transactions) into ``DIR``.
"""

from __future__ import annotations

import asyncio
import random
import sys
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from aiostream_ckpt.api import (
    AsyncFunction,
    KeyedBroadcastProcessFunction,
    MapStateDescriptor,
    RuntimeContext,
    StreamEnvironment,
    ValueStateDescriptor,
)
from aiostream_ckpt.api.contract import ProofContract
from aiostream_ckpt.api.functions import Collector, Context, OnTimerContext
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink, JsonLinesFileSource
from aiostream_ckpt.time import WatermarkStrategy
from aiostream_ckpt_dev.lookup_service import segment_of

Txn = dict[str, Any]
#: rule id -> its versions ``[ts, max_amount or None, segment or None]``, in time order
RULES: MapStateDescriptor[str, list[Any]] = MapStateDescriptor("rules", str, list)


def rule_alerts(versions: Mapping[str, list[list[Any]]], txn: Txn) -> list[str]:
    """Return the ids of the rules in force at ``txn["ts"]`` that ``txn`` breaks, sorted."""
    hits = []
    for rule_id, history in versions.items():
        current = None
        for ts, max_amount, segment in history:
            if ts > txn["ts"]:
                break
            current = (max_amount, segment)
        if current is None or current[0] is None:
            continue  # not yet in force, or withdrawn
        max_amount, segment = current
        if txn["amount"] > max_amount and segment in (None, txn["segment"]):
            hits.append(rule_id)
    return sorted(hits)


class SegmentLookup(AsyncFunction[Txn, Txn]):
    """The account's segment from the lookup service (or after ``latency`` s, simulated)."""

    def __init__(self, service: str | None, latency: float) -> None:
        self.service = service.rstrip("/") if service else None
        self.latency = latency
        self._session: aiohttp.ClientSession | None = None

    async def open(self, ctx: RuntimeContext) -> None:
        if self.service:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def invoke(self, value: Txn) -> Txn:
        if self._session is None:
            await asyncio.sleep(self.latency)
            return {**value, "segment": segment_of(value["account"])}
        query = urllib.parse.urlencode({"seq": value["seq"], "key": value["account"]})
        async with self._session.get(f"{self.service}/lookup?{query}") as resp:
            resp.raise_for_status()
            answer = await resp.json()
        return {**value, "segment": answer["segment"]}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class FraudCheck(KeyedBroadcastProcessFunction[Txn, dict[str, Any], dict[str, Any]]):
    """Hold each transaction until event time passes it, then check it against the rules."""

    def open(self, ctx: RuntimeContext) -> None:
        self.pending = ctx.get_map_state(MapStateDescriptor("pending", int, dict))
        self.alerting = ctx.get_value_state(ValueStateDescriptor("alerting", int, default=0))

    def process_element(self, value: Txn, ctx: Context, out: Collector[dict[str, Any]]) -> None:
        self.pending.put(value["seq"], value)
        ctx.timer_service().register_event_time_timer(value["ts"])

    def process_broadcast_element(
        self, value: dict[str, Any], ctx: Context, out: Collector[dict[str, Any]]
    ) -> None:
        rules = ctx.get_broadcast_state(RULES)
        history = list(rules.get(value["rule_id"], []))
        history.append([value["ts"], value.get("max_amount"), value.get("segment")])
        history.sort(key=lambda v: v[0])
        rules.put(value["rule_id"], history)

    def on_timer(self, timestamp: int, ctx: OnTimerContext, out: Collector[dict[str, Any]]) -> None:
        due = sorted(
            (t for t in self.pending.values() if t["ts"] <= timestamp),
            key=lambda t: (t["ts"], t["seq"]),
        )
        if not due:
            return
        rules = dict(ctx.get_broadcast_state(RULES).items())
        count = self.alerting.value()
        for txn in due:
            self.pending.remove(txn["seq"])
            alerts = rule_alerts(rules, txn)
            count += bool(alerts)
            out.collect({**txn, "alerts": alerts, "account_alerts": count})
        self.alerting.update(count)


def _read(paths: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in paths.split(","):
        with open(path, "rb") as f:
            out.extend(orjson.loads(line) for line in f if line.strip())
    return out


def expected_output(params: Mapping[str, Any]) -> Iterable[dict[str, Any]]:
    """Recompute the output from the input files without the engine (the proof's oracle)."""
    versions: dict[str, list[list[Any]]] = {}
    for r in sorted(_read(str(params["rules"])), key=lambda r: r["ts"]):
        versions.setdefault(r["rule_id"], []).append(
            [r["ts"], r.get("max_amount"), r.get("segment")]
        )
    counts: dict[str, int] = {}
    for txn in sorted(_read(str(params["transactions"])), key=lambda t: (t["ts"], t["seq"])):
        txn = {**txn, "segment": segment_of(txn["account"])}
        alerts = rule_alerts(versions, txn)
        counts[txn["account"]] = counts.get(txn["account"], 0) + bool(alerts)
        yield {**txn, "alerts": alerts, "account_alerts": counts[txn["account"]]}


#: Deterministic in event time; an account's records come in (ts, seq) order.
PROOF = ProofContract(
    outputs=("output",),
    inputs=("transactions", "rules"),
    key="account",
    oracle=expected_output,
)


def _ts(event: dict[str, Any]) -> int:
    return int(event["ts"])


def build(env: StreamEnvironment) -> None:
    p = env.params
    for name in ("transactions", "rules", "output"):
        if name not in p:
            raise ValueError(f"set app.{name}")
    strategy = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(_ts)
    txn_fields = {"seq": int, "account": str, "amount": int, "ts": int}
    txns = env.from_source(
        JsonLinesFileSource(
            str(p["transactions"]).split(","),
            required=txn_fields,
            rate=float(p["rate"]) if "rate" in p else None,
        ),
        uid="transactions",
        watermark_strategy=strategy,
    )
    rules = env.from_source(
        JsonLinesFileSource(str(p["rules"]), required={"rule_id": str, "ts": int}),
        uid="rules",
        parallelism=1,
        watermark_strategy=strategy,
    )
    lookup = SegmentLookup(p.get("service"), float(p.get("simulate", 0)))
    enriched = txns.map_async(lookup, capacity=int(p.get("capacity", 100)), uid="segment-lookup")
    checked = (
        enriched.key_by(lambda t: t["account"])
        .connect(rules.broadcast(RULES))
        .process(FraudCheck(), uid="fraud-check")
    )
    checked.sink_to(ExactlyOnceFileSink(str(p["output"])), uid="alerts-sink")


def write_inputs(
    directory: Path,
    transactions: int,
    *,
    accounts: int = 200,
    rule_versions: int = 40,
    seed: int = 0,
) -> tuple[Path, Path]:
    """Write sample transactions and rule versions (over the same time span) into ``directory``."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    txn_path, rules_path = directory / "transactions.jsonl", directory / "rules.jsonl"
    with open(txn_path, "wb") as f:
        for seq in range(transactions):
            txn = {"seq": seq, "account": f"acct-{rng.randrange(accounts)}"}
            txn.update(amount=rng.randint(1, 1000), ts=seq * 10)
            f.write(orjson.dumps(txn) + b"\n")
    span = transactions * 10
    times = sorted([0, *(rng.randrange(span) for _ in range(rule_versions - 1))])
    with open(rules_path, "wb") as f:
        for i, ts in enumerate(times):
            rule: dict[str, Any] = {"rule_id": f"r{i % 5}", "ts": ts}
            withdrawn = i >= 5 and rng.random() < 0.15
            rule["max_amount"] = None if withdrawn else rng.randint(500, 990)
            rule["segment"] = rng.choice([None, *(f"seg-{k}" for k in range(7))])
            f.write(orjson.dumps(rule) + b"\n")
    return txn_path, rules_path


if __name__ == "__main__":
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    print(*write_inputs(Path(sys.argv[1]), n), sep="\n")
