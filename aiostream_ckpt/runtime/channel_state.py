"""An unaligned checkpoint's channel state: the in-flight elements of a task's input channels.

Flink's ``ChannelStateWriterImpl`` and ``RecoveredChannelStateHandler``, for
one task. The barrier handler notes each in-flight element through
:meth:`ChannelStateCodec.encode` the moment it is taken (on the loop: an
operator may change a record in place once it has it), as the frame the
channels between processes use (``runtime.wire``). When barrier n has come
on every channel, :func:`write_channel_state` writes the frames to one file
in a worker thread: fsynced, its sha256 in the handle that the task's
acknowledgement carries into n's metadata. A restore verifies the file
against that checksum and replays the elements, channel by channel and in
order, before any new input (:func:`read_channel_state`).

Records are stored as JSON, as the channels between processes carry them
(exact: a record that would not come back equal declines the checkpoint,
naming it); with ``state.allow_pickle=true`` such a batch is pickled instead.
A file is layout-bound: channel ``i`` means the ``i``-th input channel of the
same job graph at the same parallelism (``restore_check``).
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from aiostream_ckpt import failpoints
from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier
from aiostream_ckpt.checkpoint.storage import storage_error
from aiostream_ckpt.errors import (
    ChannelRecordError,
    CheckpointError,
    CorruptCheckpointError,
    StateMigrationError,
)
from aiostream_ckpt.runtime.elements import (
    EndOfInput,
    ProcessingTimeTick,
    SecondInput,
    Watermark,
    WatermarkStatus,
)
from aiostream_ckpt.runtime.wire import (
    HEADER,
    FrameKind,
    JsonBatchCodec,
    decode_control,
    encode_control,
)

#: Where a task's channel state sits in its first operator's checkpoint entry.
CHANNEL_KEY = "channel"
_MAGIC = b"ASCHANNELS1\n"
#: frame kinds of batches in a channel state file only (never on the wire)
_SECOND_INPUT = 100
_PICKLED = 101
_PICKLED_SECOND_INPUT = 102
_JSON_KINDS = {int(FrameKind.BATCH): False, _SECOND_INPUT: True}
_PICKLE_KINDS = {_PICKLED: False, _PICKLED_SECOND_INPUT: True}

#: one noted element: (frame kind, payload, records in it)
Frame = tuple[int, bytes, int]


class ChannelStateError(CheckpointError):
    """An in-flight element cannot go into the channel state; the checkpoint is declined."""

    retriable = False


class ChannelStateCodec:
    """Turns in-flight elements into frames (see the module docstring) and back."""

    def __init__(self, *, allow_pickle: bool) -> None:
        self._json = JsonBatchCodec()
        self._allow_pickle = allow_pickle

    def encode(self, element: Any) -> Frame | None:
        """Return ``element``'s frame; None for what no replay needs (end of input, ticks)."""
        cls = type(element)
        if cls is list or cls is SecondInput:
            second = cls is SecondInput
            batch: list[Any] = element.batch if second else element
            try:
                payload = self._json.encode(batch)
                kind = _SECOND_INPUT if second else int(FrameKind.BATCH)
            except ChannelRecordError as exc:
                if not self._allow_pickle:
                    raise ChannelStateError(
                        f"a record in flight cannot go into the unaligned checkpoint's channel "
                        f"state: {str(exc).split('; channels between')[0]}; records must be "
                        "JSON-like, or set state.allow_pickle=true"
                    ) from exc
                payload = pickle.dumps(batch, protocol=5)
                kind = _PICKLED_SECOND_INPUT if second else _PICKLED
            return kind, payload, len(batch)
        if cls is Watermark or cls is WatermarkStatus:
            kind, payload = encode_control(element)
            return int(kind), payload, 0
        if cls is EndOfInput or cls is ProcessingTimeTick or cls is CheckpointBarrier:
            return None  # the upstream sends its end again after a restore
        raise ChannelStateError(f"{cls.__name__} cannot go into a channel state")

    def decode(self, kind: int, payload: bytes) -> Any:
        if kind in _JSON_KINDS:
            batch = self._json.decode(payload)
            return SecondInput(batch) if _JSON_KINDS[kind] else batch
        if kind in _PICKLE_KINDS:
            batch = pickle.loads(payload)
            return SecondInput(batch) if _PICKLE_KINDS[kind] else batch
        return decode_control(kind, payload)


def write_channel_state(
    directory: Path, root: Path, channels: dict[int, list[Frame]], layout: Sequence[str]
) -> dict[str, Any] | None:
    """Write ``channels``' frames to ``directory``; return the handle (None: nothing in flight).

    Runs in a worker thread. The handle names the file relative to ``root``
    with its size and sha256, and counts per channel.
    """
    if not any(channels.values()):
        return None
    path = directory / "channel-state"
    digest = hashlib.sha256()
    counts: dict[str, list[int]] = {}
    try:
        with open(path, "wb") as f:
            for chunk in _file_chunks(channels, counts):
                digest.update(chunk)
                f.write(chunk)
            f.flush()
            failpoints.hit("channel_state_write")
            os.fsync(f.fileno())
        size = path.stat().st_size
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise storage_error("write", path, exc) from exc
    return {
        "file": path.relative_to(root).as_posix(),
        "size_bytes": size,
        "sha256": digest.hexdigest(),
        "records": sum(r for _, r in counts.values()),
        "channels": counts,
        "layout": list(layout),
    }


def _file_chunks(channels: dict[int, list[Frame]], counts: dict[str, list[int]]) -> Iterator[bytes]:
    yield _MAGIC
    for channel in sorted(channels):
        frames = channels[channel]
        if not frames:
            continue
        counts[str(channel)] = [len(frames), sum(n for _, _, n in frames)]
        for kind, payload, _ in frames:
            yield HEADER.pack(len(payload), channel, kind)
            yield payload


def read_channel_state(
    root: Path, handle: dict[str, Any], codec: ChannelStateCodec
) -> list[tuple[int, Any]]:
    """Verify and decode a channel state file: ``(channel, element)`` in replay order."""
    path = root / str(handle["file"])
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CorruptCheckpointError(
            f"channel state {path} is unreadable: {exc.strerror or exc}"
        ) from exc
    if len(data) != handle["size_bytes"] or hashlib.sha256(data).hexdigest() != handle["sha256"]:
        raise CorruptCheckpointError(f"channel state {path} does not match its checksum")
    if not data.startswith(_MAGIC):
        raise CorruptCheckpointError(f"channel state {path} is not a channel state file")
    out: list[tuple[int, Any]] = []
    pos, end = len(_MAGIC), len(data)
    try:
        while pos < end:
            length, channel, kind = HEADER.unpack_from(data, pos)
            pos += HEADER.size
            out.append((channel, codec.decode(kind, data[pos : pos + length])))
            pos += length
    except Exception as exc:
        raise CorruptCheckpointError(f"channel state {path} cannot be decoded: {exc}") from exc
    return out


def restore_check(
    handle: dict[str, Any],
    *,
    checkpoint_id: int,
    uid: str,
    old_parallelism: int,
    parallelism: int,
    layout: Sequence[str],
) -> None:
    """Refuse channel state whose channels mean something else in this job (rescaled, rewired).

    The records were routed to their channel by the old graph; replayed at
    another parallelism some would reach a subtask that does not own their
    key group. A savepoint is always aligned (it has no channel state), so it
    is the way to rescale.
    """
    old_layout = list(handle.get("layout", ()))
    if old_parallelism == parallelism and old_layout == list(layout):
        return
    what = (
        f"parallelism {old_parallelism}, now {parallelism}"
        if old_parallelism != parallelism
        else f"inputs {', '.join(old_layout)}, now {', '.join(layout)}"
    )
    raise StateMigrationError(
        f"checkpoint {checkpoint_id} is unaligned (checkpoint.unaligned=true): it holds "
        f"{handle.get('records', '?')} in-flight record(s) into operator {uid!r}, whose "
        f"input channels changed ({what}); in-flight records cannot be moved to other channels. "
        "To rescale, take a savepoint (always aligned) with the old parallelism and start "
        "from it, or restore a checkpoint taken with checkpoint.unaligned=false"
    )
