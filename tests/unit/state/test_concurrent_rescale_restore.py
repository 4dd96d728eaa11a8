"""Restoring several new instances from the same old files at once, as a rescaled job does."""

from __future__ import annotations

import threading

from aiostream_ckpt.state.descriptors import ValueStateDescriptor


def test_parallel_restores_from_shared_files(env):
    """py-lmdb refuses to open one file twice in a process: restores must not collide."""
    handles = []
    for index in range(2):
        b = env.backend(index=index, parallelism=2)
        v = b.create_state(ValueStateDescriptor("v"))
        for i in range(400):
            if env.owner(i, 2) == index:
                b.key_context.key = i
                v.update(i)
        handles.append(env.checkpoint(b, 1, savepoint=True))
    errors: list[BaseException] = []
    restored: dict[int, int] = {}

    def restore(index: int, parallelism: int) -> None:
        b = env.backend(index=index, parallelism=parallelism, uid=f"op-{parallelism}-{index}")
        try:
            b.restore(env.root, handles)
            restored[index] = len(list(b.keys("v")))
        except BaseException as exc:
            errors.append(exc)

    for _ in range(20):
        threads = [threading.Thread(target=restore, args=(i, 6)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[0]
        assert sum(restored.values()) == 400
