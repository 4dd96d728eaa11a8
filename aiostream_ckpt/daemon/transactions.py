"""``aiostream-ckpt transactions list|commit|abort``: a stopped job's Kafka transactions.

Why: an open transaction left by a crashed job holds every ``read_committed``
reader back (the last stable offset stops at it) until the broker's timeout
aborts it, which may also lose records a completed checkpoint pre-committed.
Recovery settles all of them when the job restarts; these commands show and
settle them without the job, with the same rules:

- ``commit ID`` only what the newest completed checkpoint lists as
  pre-committed (EndTxn with its stored producer id and epoch);
- ``abort ID`` only an id under one of the job's sinks' prefixes, and never
  one the newest completed checkpoint pre-committed (its records belong in
  the output: commit it). Aborting is InitProducerId, as recovery fences.

Both refuse while the job's daemon runs on that checkpoint directory: its
producers own these ids.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from aiostream_ckpt.checkpoint.storage import CheckpointStorage
from aiostream_ckpt.connectors.kafka.addresses import check_bootstrap_servers
from aiostream_ckpt.connectors.kafka.committer import PendingTxn
from aiostream_ckpt.connectors.kafka.common import bootstrap_client
from aiostream_ckpt.connectors.kafka.transactions import EndTxnOutcome, end_prepared_transaction
from aiostream_ckpt.connectors.kafka.txn_admin import (
    TransactionInfo,
    describe_transactions,
    fence_transactional_id,
    list_transactional_ids,
)
from aiostream_ckpt.daemon.address import ADDRESS_FILE, is_daemon_alive, read
from aiostream_ckpt.errors import CheckpointError, ConnectorError

_TIMEOUT_S = 30.0


@dataclass
class JobTransactions:
    """What the newest completed checkpoint says about the job's Kafka sinks."""

    checkpoint_id: int | None
    #: transactional id prefix -> sink uid
    prefixes: dict[str, str]
    #: transactional id -> the pre-committed transaction the checkpoint lists
    listed: dict[str, PendingTxn]


def read_job_transactions(directory: Path, extra_prefixes: list[str]) -> JobTransactions:
    """Read the prefixes and pre-committed transactions of the newest completed checkpoint."""
    if not directory.is_dir():
        raise CheckpointError(f"not a checkpoint directory: {directory}")
    chk = CheckpointStorage(directory, create=False).latest_valid()
    prefixes = dict.fromkeys(extra_prefixes, "(--prefix)")
    listed: dict[str, PendingTxn] = {}
    if chk is not None:
        for uid, op in chk.operators.items():
            for st in op.get("subtasks", {}).values():
                writer = (st.get("operator") or {}).get("writer")
                if not isinstance(writer, dict) or "prefix" not in writer:
                    continue
                prefixes[str(writer["prefix"])] = uid
                for entry in writer.get("pending", []):
                    pending = PendingTxn.from_state(entry)
                    listed[pending.txn.transactional_id] = pending
    if not prefixes:
        raise CheckpointError(
            f"{directory}: no Kafka exactly-once sink state in the newest completed checkpoint; "
            "name the transactional id prefix with --prefix"
        )
    return JobTransactions(chk.checkpoint_id if chk else None, prefixes, listed)


def _refuse_if_running(directory: Path) -> None:
    try:
        address = read(directory / ADDRESS_FILE)
    except (OSError, ValueError):
        return
    if is_daemon_alive(address.pid):
        raise _refused(
            f"the job's daemon (pid {address.pid}) runs on {directory}: its producers own "
            "these transactions; stop it first (recovery on restart settles them too)"
        )


def _still_pending(info: TransactionInfo | None, listed: PendingTxn) -> bool:
    """Whether the broker still holds ``listed`` open, with its stored producer id and epoch."""
    return (
        info is not None
        and info.is_open
        and (info.producer_id, info.producer_epoch)
        == (listed.txn.producer_id, listed.txn.producer_epoch)
    )


def _refused(message: str) -> ConnectorError:
    return ConnectorError(message, retriable=False)


def _describe_row(
    info: TransactionInfo | None, txn_id: str, job: JobTransactions
) -> dict[str, Any]:
    listed = job.listed.get(txn_id)
    row: dict[str, Any] = {"transactional_id": txn_id}
    if info is None:
        row.update(state="unknown to the broker", age_seconds=None)
    else:
        row.update(
            state=info.state,
            age_seconds=info.age_s(time.time() * 1000),
            producer_id=info.producer_id,
            producer_epoch=info.producer_epoch,
            partitions=info.partitions,
        )
    if listed is not None:
        row["checkpoint"] = listed.checkpoint_id
        row["recovery"] = "commit" if _still_pending(info, listed) else "none"
    else:
        row["checkpoint"] = None
        row["recovery"] = "abort" if info is not None and info.is_open else "none"
    return row


async def list_rows(
    bootstrap: str, job: JobTransactions, config: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """One row per transactional id the job owns (broker and checkpoint), open ones first.

    ``config``: client settings (the job's ``kafka.*`` TLS/SASL, as ``client_kwargs``).
    """
    client = await bootstrap_client(
        bootstrap, config or {}, timeout_s=_TIMEOUT_S, what="transactions"
    )
    try:
        ids: set[str] = set(job.listed)
        for prefix in job.prefixes:
            ids.update(await list_transactional_ids(client, prefix=f"{prefix}-"))
        infos = {i.transactional_id: i for i in await describe_transactions(client, sorted(ids))}
    finally:
        await client.close()
    rows = [_describe_row(infos.get(t), t, job) for t in sorted(ids)]
    return sorted(rows, key=lambda r: (r["recovery"] == "none", r["transactional_id"]))


async def commit_one(
    bootstrap: str, job: JobTransactions, txn_id: str, config: dict[str, Any] | None = None
) -> str:
    listed = job.listed.get(txn_id)
    if listed is None:
        raise _refused(
            f"{txn_id} is not pre-committed in the newest completed checkpoint "
            f"({job.checkpoint_id}): only those may be committed"
        )
    client = await bootstrap_client(
        bootstrap, config or {}, timeout_s=_TIMEOUT_S, what="transactions"
    )
    try:
        outcome = await end_prepared_transaction(
            client, listed.txn, commit=True, timeout_s=_TIMEOUT_S
        )
    finally:
        await client.close()
    if outcome is not EndTxnOutcome.COMPLETED:
        raise _refused(
            f"{txn_id} (producer {listed.txn.producer_id}, epoch {listed.txn.producer_epoch}) "
            f"of checkpoint {listed.checkpoint_id} cannot be committed: {outcome.value} "
            "(it already ended; a restart of the job checks whether its records are in "
            "the output)"
        )
    return f"committed {txn_id} of checkpoint {listed.checkpoint_id}"


async def abort_one(
    bootstrap: str, job: JobTransactions, txn_id: str, config: dict[str, Any] | None = None
) -> str:
    if not any(txn_id.startswith(f"{p}-") for p in job.prefixes):
        raise _refused(
            f"{txn_id} is not one of this job's transactional ids "
            f"(prefixes: {', '.join(sorted(job.prefixes))})"
        )
    client = await bootstrap_client(
        bootstrap, config or {}, timeout_s=_TIMEOUT_S, what="transactions"
    )
    try:
        listed = job.listed.get(txn_id)
        if listed is not None:
            (info,) = await describe_transactions(client, [txn_id]) or (None,)
            if _still_pending(info, listed):
                raise _refused(
                    f"{txn_id} holds the records of completed checkpoint "
                    f"{listed.checkpoint_id}: aborting would lose them; commit it instead"
                )
        _, epoch = await fence_transactional_id(
            client, txn_id, transaction_timeout_ms=60_000, timeout_s=_TIMEOUT_S
        )
    finally:
        await client.close()
    return f"aborted {txn_id}: its open transaction (if any) is aborted, epoch now {epoch}"


def _table(rows: list[dict[str, Any]]) -> str:
    head = f"{'transactional id':40}  {'state':15}  {'age':>9}  {'checkpoint':>10}  recovery"
    lines = [head]
    for r in rows:
        age = "-" if r.get("age_seconds") is None else f"{r['age_seconds']:.0f}s"
        ckpt = "-" if r["checkpoint"] is None else str(r["checkpoint"])
        lines.append(
            f"{r['transactional_id']:40}  {r['state']:15}  {age:>9}  {ckpt:>10}  {r['recovery']}"
        )
    return "\n".join(lines)


def client_config(config_file: Path | None, sets: list[str]) -> dict[str, Any]:
    """Return the job's Kafka TLS/SASL settings (``kafka.*``: TOML, env, ``--set``) as kwargs."""
    from aiostream_ckpt.daemon.config import load_config

    loaded = load_config(config_file, env=os.environ, sets=sets)
    return loaded.job.kafka.client_kwargs()


def transactions_main(args: argparse.Namespace) -> int:
    bootstrap = check_bootstrap_servers(args.bootstrap)
    config = client_config(getattr(args, "config", None), getattr(args, "sets", []))
    job = read_job_transactions(args.checkpoint_dir, args.prefix)
    if args.action == "list":
        rows = asyncio.run(list_rows(bootstrap, job, config))
        if args.json:
            print(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode())
        else:
            print(_table(rows))
        return 0
    _refuse_if_running(args.checkpoint_dir)
    run = commit_one if args.action == "commit" else abort_one
    print(asyncio.run(run(bootstrap, job, args.id, config)))
    return 0
