"""State that lives for weeks: the working LMDB and the caches hold live state, not history.

The working store must stay the same size over many checkpoints at constant
keys (freed pages reused, not appended), and a key's map must hold its live
entries only, however many windows or timers it had: what ``items()`` walks.
"""

from __future__ import annotations

import asyncio

from aiostream_ckpt.state.descriptors import MapStateDescriptor, ValueStateDescriptor
from aiostream_ckpt.state.lmdb.map_state import LOAD_WHOLE
from aiostream_ckpt.time.timers import InternalTimerService

KEYS = 2000
WARM_UP = 20
CHECKPOINTS = 80


def _checkpoint(env, b, cid):
    """One checkpoint as the task runs it: snapshot, prepare, write, settle, complete."""

    async def run():
        part = b.snapshot(env.target(cid))
        await part.prepare()
        part.write()
        await part.settle()

    asyncio.run(run())
    b.notify_checkpoint_complete(cid)


def _sizes(env, b, epoch):
    """Working-store bytes after the warm-up and at the end of ``CHECKPOINTS`` epochs.

    The tests allow 2 % between the two (LMDB's free list varies by a page or
    two); before pages were reused the store grew 4x over these 60 checkpoints.
    """
    sizes = {}
    for cid in range(1, CHECKPOINTS + 1):
        epoch(cid)
        b.after_batch()
        _checkpoint(env, b, cid)
        if cid in (WARM_UP, CHECKPOINTS):
            sizes[cid] = b.working_bytes()
    return sizes[WARM_UP], sizes[CHECKPOINTS]


def test_value_state_store_does_not_grow_at_constant_keys(env):
    # every key cached: no read comes to renew the loop's read view after a commit
    b = env.backend(full_checkpoint_every=10)
    pv = b.create_state(ValueStateDescriptor("pv", default=0))

    def epoch(cid):
        for i in range(KEYS):
            b.key_context.key = f"app-{i}"
            pv.update(pv.value() % 1000 + 1000)  # four digits: the live pages do not grow

    warm, end = _sizes(env, b, epoch)
    # each checkpoint rewrites every leaf page; without page reuse each added a
    # copy of the tree (1.5 MB -> 6.1 MB), with it the freed pages are reused
    assert end <= warm * 1.02, (warm, end)


def test_window_and_timer_state_store_does_not_grow(env):
    # tumbling windows: per key a new window and its timer each epoch, the one
    # before fired and removed, as the window operator does (the watermark one
    # window behind: every checkpoint holds a window and a timer per key)
    b = env.backend(full_checkpoint_every=10)
    contents = b.create_state(MapStateDescriptor("window-contents"))
    timers = InternalTimerService(b)
    timers.open()
    fired = []

    def on_timer(ts, key):
        for window, count in list(contents.items()):
            if window[1] - 1 == ts:
                fired.append(count)
                contents.remove(window)

    def epoch(cid):
        window = (cid * 1000, cid * 1000 + 1000)
        for i in range(KEYS):
            b.key_context.key = f"card-{i}"
            for _ in range(3):
                contents.put(window, contents.get(window, 0) + 1)
            timers.register_event_time_timer(window[1] - 1)
        timers.advance_watermark(window[0] - 1, on_timer)

    warm, end = _sizes(env, b, epoch)
    assert fired == [3] * KEYS * (CHECKPOINTS - 1)
    assert end <= warm * 1.02, (warm, end)
    # and the caches hold what is live (a window and a timer per key), not history
    assert b.cached_entries("window-contents") == KEYS
    assert b.cached_entries("_timers.event") == KEYS
    assert timers.pending() == (KEYS, 0)


def test_items_walks_live_entries_only(env):
    # session-like churn: a key's windows come and go; items() per record must
    # not walk every window the key ever had
    b = env.backend()
    m = b.create_state(MapStateDescriptor("sessions"))
    b.key_context.key = "user-1"
    for w in range(5000):
        m.put((w, w + 10), w)
        assert [k for k, _ in m.items()] == [(w, w + 10)]
        m.remove((w, w + 10))
        if w % 500 == 0:
            _checkpoint(env, b, w // 500 + 1)
    assert b.cached_entries("sessions") == 0
    assert list(m.items()) == []


def test_big_map_read_entry_by_entry_drops_markers_once_complete(env):
    # a map bigger than LOAD_WHOLE is not read whole when its key is cached:
    # removals are markers until items() completes it; then they go
    n = LOAD_WHOLE * 2
    b = env.backend(cache_max_entries=4)
    m = b.create_state(MapStateDescriptor("big"))
    b.key_context.key = "k"
    for i in range(n):
        m.put(i, i)
    for other in range(8):  # evict "k": its entries are only in LMDB now
        b.key_context.key = f"other-{other}"
        m.put(0, 0)
    b.after_batch()
    b.key_context.key = "k"
    assert m.get(3) == 3
    for i in range(0, n, 2):
        m.remove(i)
    assert m.get(4) is None and m.contains(5) and not m.contains(6)
    assert b.cached_entries("big") >= n // 2  # markers hide the stored entries meanwhile
    assert dict(m.items()) == {i: i for i in range(1, n, 2)}
    b.key_context.key = "k"
    assert b.cached_entries("big") <= n // 2 + 8  # "k"'s live entries, one per other key
    m.remove(1)
    assert not m.contains(1) and len(dict(m.items())) == n // 2 - 1
    _checkpoint(env, b, 1)
    b2 = env.backend()
    b2.restore(env.root, [env.checkpoint(b, 2)])
    m2 = b2.create_state(MapStateDescriptor("big"))
    b2.key_context.key = "k"
    assert dict(m2.items()) == {i: i for i in range(3, n, 2)}
