"""Recovering a staged-file output directory, under the output contract.

The contract (what a reader of the directory may rely on):

- a visible ``part-<checkpoint>-<subtask>.jsonl`` is committed: its content
  never changes and its name is never used again, by this run or any later
  one restored into the directory (checkpoint ids only grow: a new attempt
  starts above the highest id any file of the directory, retracted ones
  included, is named by);
- output is withdrawn only when a restore goes back before it (a corrupt
  newest checkpoint, or a savepoint restored with ``--allow-retract-output``),
  only after every task's restored state was verified, and never deleted:
  the files move to ``_retracted/<restore tag>/`` with a manifest saying
  which files, how many records, why, which checkpoint was restored and
  which checkpoint each file belonged to; their records are produced again
  from the restored point.

A directory also carries a hidden location marker: the writer state records
it, so a savepoint restored into another directory or a fresh volume starts
a fresh output there instead of looking for the old location's staged files.

A savepoint holds its own copy of the pre-committed files it lists
(:mod:`.held_output`): restored into their directory, a listed file that is
neither staged nor committed (the job went back to an older checkpoint after
the savepoint, whose recovery aborted it) is brought back from that copy.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import secrets
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson

from aiostream_ckpt.connectors.base import RestoreInfo
from aiostream_ckpt.connectors.held_output import HeldCopy, unusable
from aiostream_ckpt.durable import fsync_dir

log = logging.getLogger(__name__)

LOCATION_FILE = "_output_location"
RETRACTED_DIR = "_retracted"


class Naming(Protocol):
    def staged_subtask(self, name: str) -> int | None: ...

    def committed(self, name: str) -> tuple[int, int] | None: ...


@dataclass
class RecoveryPlan:
    """What recovering one writer does; worked out before anything is touched."""

    #: (staged, final) pre-committed files to commit now
    commit: list[tuple[str, str]] = field(default_factory=list)
    #: listed pre-committed files that are neither staged nor committed (and why no
    #: savepoint copy stands in, when the restored state has copies)
    lost: list[str] = field(default_factory=list)
    #: (staged, final, the savepoint's copy) listed files to bring back from the copy,
    #: then commit (this writer's own: another owner's are its to bring back)
    from_copy: list[tuple[str, str, Path]] = field(default_factory=list)
    #: staged files of this writer the restored state does not list
    abort: list[str] = field(default_factory=list)
    #: (name, checkpoint id) of committed files newer than the restored checkpoint
    retract: list[tuple[str, int]] = field(default_factory=list)
    #: committed files in a directory this restore must find without output
    foreign: list[str] = field(default_factory=list)
    #: location id the directory has or will get (None: a new one is made)
    location: str | None = None
    #: the restored state belongs to this directory (its staged files are ours to recover)
    same: bool = True
    highest_id: int = 0


def read_location(directory: Path) -> str | None:
    try:
        return (directory / LOCATION_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def claim_location(directory: Path, wanted: str | None) -> str:
    """Give ``directory`` its location id unless it has one (writers race: first wins)."""
    current = read_location(directory)
    if current is not None:
        return current
    tmp = directory / f"{LOCATION_FILE}.{secrets.token_hex(4)}.tmp"
    tmp.write_text((wanted or uuid.uuid4().hex) + "\n")
    try:
        with contextlib.suppress(FileExistsError):
            os.link(tmp, directory / LOCATION_FILE)  # exclusive, unlike rename
    finally:
        tmp.unlink(missing_ok=True)
    located = read_location(directory)
    assert located is not None
    return located


def _highest_id(directory: Path, names: Iterable[str], naming: Naming) -> int:
    ids = [p[0] for p in map(naming.committed, names) if p is not None]
    retracted = directory / RETRACTED_DIR
    if retracted.is_dir():
        for sub in retracted.iterdir():
            if sub.is_dir():
                ids += [p[0] for p in map(naming.committed, os.listdir(sub)) if p is not None]
    return max(ids, default=0)


def plan_recovery(
    directory: Path,
    naming: Naming,
    owns: Callable[[int], bool],
    restored: dict[str, Any] | None,
    checkpoint_id: int | None,
    *,
    copies: Mapping[str, HeldCopy] | None = None,
    copy_root: Path | None = None,
    verify: bool = True,
) -> RecoveryPlan:
    """Classify the directory's files for a writer restored to ``checkpoint_id`` (read-only).

    ``checkpoint_id`` None is a fresh start (committed output there is
    foreign); 0 a restore to before the first checkpoint (every checkpoint
    was set aside: all own output is newer). ``copies`` (in the savepoint
    directory ``copy_root``) stand in for listed files that are gone; their
    sha256 is checked with ``verify`` (the survey), their size always.
    """
    names = os.listdir(directory) if directory.is_dir() else []
    present = set(names)
    listed = [(str(s), str(f)) for s, f in (restored or {}).get("pending", [])]
    state_location = (restored or {}).get("location")
    marker = read_location(directory)
    if state_location is None or marker == state_location:
        same = True
    elif marker is None:  # a directory that lost its marker still holds the listed files
        same = any(s in present or f in present for s, f in listed)
    else:
        same = False
    plan = RecoveryPlan(highest_id=_highest_id(directory, names, naming), same=same)
    plan.location = marker if marker is not None else (state_location if same else None)
    keep: set[str] = set()
    if same:
        for staged, final in listed:
            keep.add(staged)
            if staged in present:
                plan.commit.append((staged, final))
            elif final not in present:
                _from_copy(plan, naming, owns, staged, final, copies, copy_root, verify)
    for name in names:
        sub = naming.staged_subtask(name)
        if sub is not None:
            if owns(sub) and name not in keep:
                plan.abort.append(name)
            continue
        parsed = naming.committed(name)
        if parsed is None:
            continue
        cid, sub = parsed
        if checkpoint_id is None or not same:
            plan.foreign.append(name)
        elif cid > checkpoint_id and owns(sub):
            plan.retract.append((name, cid))
    plan.retract.sort(key=lambda r: r[1])
    return plan


def _from_copy(
    plan: RecoveryPlan,
    naming: Naming,
    owns: Callable[[int], bool],
    staged: str,
    final: str,
    copies: Mapping[str, HeldCopy] | None,
    copy_root: Path | None,
    verify: bool,
) -> None:
    """Plan to bring ``staged`` back from the savepoint's copy, or call it lost."""
    copy = (copies or {}).get(staged)
    if copy is None or copy_root is None:
        plan.lost.append(staged)
        return
    sub = naming.staged_subtask(staged)
    if sub is not None and not owns(sub):
        return  # its owner brings it back (and says so if it cannot)
    why = unusable(copy_root, copy, verify=verify)
    if why is not None:
        plan.lost.append(f"{staged} ({why})")
    else:
        plan.from_copy.append((staged, final, copy_root / copy.path))


def count_records(path: Path) -> int:
    """Lines of a committed JSON-lines file (one record each)."""
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            n += chunk.count(b"\n")
    return n


def retract_files(
    directory: Path,
    files: list[tuple[str, int]],
    *,
    restore: RestoreInfo | None,
    checkpoint_id: int,
    owner: str,
    count: Callable[[Path], int] = count_records,
) -> int:
    """Move committed ``files`` aside with a manifest; return their record count.

    ``count``: the records of one file (JSON lines by default; Parquet: its row count).

    The manifest is durable before the first file moves: a crash in between
    leaves files still visible, which the next recovery retracts again.
    """
    if restore is not None:
        tag = restore.tag
    else:  # unique, like a restore's tag: a later retraction must not replace this manifest
        tag = f"{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
    target = directory / RETRACTED_DIR / tag
    target.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    for name, cid in files:
        path = directory / name
        entries.append(
            {
                "file": name,
                "checkpoint": cid,
                "records": count(path),
                "bytes": path.stat().st_size,
            }
        )
    total = sum(int(e["records"]) for e in entries)
    kind = restore.kind if restore is not None else "checkpoint"
    manifest = {
        "what": entries,
        "records": total,
        "why": (
            f"committed after the restored {kind} {checkpoint_id}: the job was restored to "
            "a point before this output, and produces its records again from there"
        ),
        "restored": restore.to_json() if restore is not None else {"id": checkpoint_id},
        "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    manifest_path = target / f"_manifest-{owner}.json"
    tmp = manifest_path.with_name(manifest_path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, manifest_path)
    for name, _ in files:
        os.rename(directory / name, target / name)
    fsync_dir(target)
    fsync_dir(directory)
    log.warning(
        "%s: retracted %d committed record(s) in %d file(s) of checkpoint(s) %s, committed "
        "after the restored %s %d; moved to %s with a manifest, their records are produced again",
        directory,
        total,
        len(files),
        ", ".join(str(c) for c in sorted({c for _, c in files})),
        kind,
        checkpoint_id,
        target,
    )
    return total
