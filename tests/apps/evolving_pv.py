"""pv_count with a second, per-user count, in variants for savepoint compatibility tests.

``app.variant``:

- ``base``: events -> pv-count -> pv-sink (``out/pv``) and events -> user-count ->
  user-sink (``out/users``);
- ``added``: base plus a new stateful operator, events -> pv-count-new -> new-sink
  (``out/new``);
- ``renamed``: the user branch's uids changed (user-count-v2, user-sink-v2,
  ``out/users2``): its old state is not restorable.

Counts are emitted as ``{"app_id": key, "pv": n}`` for both keys, so one checker serves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiostream_ckpt.api import StreamEnvironment
from aiostream_ckpt.connectors.files import ExactlyOnceFileSink
from aiostream_ckpt.connectors.generator import GeneratorSource
from apps.pv_count import CountPageViews, app_id


def user_id(event: dict[str, Any]) -> Any:
    return event["user_id"]


def build(env: StreamEnvironment) -> None:
    p = env.params
    variant = str(p.get("variant", "base"))
    out = Path(str(p["output"]))
    source = GeneratorSource(
        int(p["generate"]),
        keys=int(p.get("keys", 100)),
        users=int(p.get("users", 500)),
        rate=float(p["rate"]) if "rate" in p else None,
    )
    events = env.from_source(source, uid="events")
    pv = events.key_by(app_id).process(CountPageViews(), uid="pv-count")
    pv.sink_to(ExactlyOnceFileSink(out / "pv"), uid="pv-sink")
    suffix = "-v2" if variant == "renamed" else ""
    users = events.key_by(user_id).process(CountPageViews(), uid=f"user-count{suffix}")
    users.sink_to(
        ExactlyOnceFileSink(out / f"users{'2' if suffix else ''}"), uid=f"user-sink{suffix}"
    )
    if variant == "added":
        new = events.key_by(app_id).process(CountPageViews(), uid="pv-count-new")
        new.sink_to(ExactlyOnceFileSink(out / "new"), uid="new-sink")
