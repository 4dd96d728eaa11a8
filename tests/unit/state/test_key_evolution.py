"""A restore refuses a ``key_by(key_type=)`` whose stored keys it would look up otherwise.

Keyed state is found by its key's JSON bytes. Checkpointed under ``int``
keys and restored by a job that declares ``str`` keys, every lookup of
``"1"`` missed the stored ``1``: each key silently started empty (and
``keys()`` failed, or read the wrong type). Each handle now records the
key type and the classes it reaches; another one fails the restore with a
StateMigrationError naming the operator and both types. The same type, a
widened one, a first declaration, and handles without the record pass.
"""

from __future__ import annotations

import enum
from dataclasses import field, make_dataclass
from typing import Any

import msgspec
import orjson
import pytest

from aiostream_ckpt.errors import StateMigrationError
from aiostream_ckpt.state.descriptors import MapStateDescriptor, ValueStateDescriptor
from aiostream_ckpt.time.timers import EVENT_TIMERS

D = ValueStateDescriptor("n", int)
Acct = make_dataclass("Acct", [("bank", str), ("n", int)], frozen=True)
AcctGrown = make_dataclass(
    "Acct", [("bank", str), ("n", int), ("branch", str, field(default=""))], frozen=True
)
AcctWide = make_dataclass("Acct", [("bank", str), ("n", int | None)], frozen=True)
AcctSwapped = make_dataclass("Acct", [("n", int), ("bank", str)], frozen=True)
Shade = enum.Enum("Shade", {"DARK": "dark"})
IntShade = enum.Enum("Shade", {"DARK": 1})


def _checkpoint(env: Any, key_type: Any, key: Any) -> Any:
    b = env.backend(key_type=key_type)
    b.key_context.key = key
    b.create_state(D).update(5)
    return env.checkpoint(b, 1)


@pytest.mark.parametrize(
    ("before", "key", "after", "what"),
    [
        (int, 1, str, "keys written as int, the job now declares key_type str"),
        (str, "1", int, "written as str, the job now declares key_type int"),
        (int | None, 1, int, r"Union\[NoneType,int\], the job now declares key_type int"),
        (Shade, Shade.DARK, None, "written as Shade, the job now declares no key_type"),
        (tuple[str, Shade], ("a", Shade.DARK), None, r"Shade\], the job now declares no key_type"),
        (Acct, Acct("x", 1), AcctGrown, r"Acct keys with fields \['bank', 'n'\]"),
        (Acct, Acct("x", 1), AcctSwapped, r"\['bank', 'n'\], the job now declares \['n', 'bank'\]"),
        (Acct, Acct("x", 1), make_dataclass("Acct", [("bank", str), ("n", str)]), "field 'n'"),
        (Shade, Shade.DARK, IntShade, "Shade keys of values str, the job now declares int"),
    ],
    ids=[
        "int-str",
        "str-int",
        "narrowed",
        "enum-dropped",
        "tuple-enum-dropped",
        "grown",
        "order",
        "field",
        "enum",
    ],
)
def test_restore_refuses_another_key_type(env, before, key, after, what) -> None:
    """Fails on the code before (restored: the stored key was not found under the new
    type's encoding, or read back as another type)."""
    handle = _checkpoint(env, before, key)
    r = env.backend(key_type=after)
    with pytest.raises(StateMigrationError, match=rf"operator 'op': its checkpoint holds .*{what}"):
        r.restore(env.root, [handle])


@pytest.mark.parametrize(
    ("before", "key", "after"),
    [
        (int, 1, int),
        (int, 1, int | None),
        (Acct, Acct("x", 1), AcctWide),
        (None, 1, int),
        (int, 1, None),
        (tuple[str, int | None], ("a", 1), None),
        (tuple[int, ...], (1, 2), None),
        (Shade, Shade.DARK, Shade),
    ],
    ids=[
        "same",
        "widened",
        "field-widened",
        "declared",
        "plain-dropped",
        "tuple-dropped",
        "variadic-dropped",
        "enum",
    ],
)
def test_restore_takes_the_same_or_a_widened_key_type(env, before, key, after) -> None:
    """tuple-dropped, variadic-dropped: refused on the code before ("keys written as
    tuple[str,Union[NoneType,int]], the job now declares no key_type"), though
    undeclared keys read the same JSON arrays back as the same tuples."""
    r = env.backend(key_type=after)
    r.restore(env.root, [_checkpoint(env, before, key)])
    [got] = list(r.keys("n"))
    assert repr(got) == repr(key)  # an Acct of the declared class
    r.key_context.key = got
    assert r.create_state(D).value() == 5


def test_a_handle_without_the_key_record_has_its_keys_scanned(env) -> None:
    """Before, restored: "1" looked up, 1 stored (the silent miss). Now its stored
    keys are read as for undeclared ones: int keys restore under int, not str."""
    handle = _checkpoint(env, int, 1)
    del handle["keys"]  # as written before the record was kept
    with pytest.raises(StateMigrationError, match="a stored key does not fit: 1 "):
        env.backend(key_type=str).restore(env.root, [handle])
    r = env.backend(key_type=int)
    r.restore(env.root, [handle])
    r.key_context.key = 1
    assert r.create_state(D).value() == 5


def _undeclared(env: Any, keys: list[Any], timer_keys: tuple[Any, ...] = ()) -> Any:
    """Checkpoint undeclared keys: each key's value 5 and an event timer (``timer_keys``:
    a timer only)."""
    b = env.backend()
    timers = b.create_state(MapStateDescriptor(EVENT_TIMERS))
    for key in [*keys, *timer_keys]:
        b.key_context.key = key
        if key in keys:
            b.create_state(D).update(5)
        timers.put(7, None)
    return env.checkpoint(b, 1)


@pytest.mark.parametrize(
    ("keys", "timer_keys", "after", "what"),
    [
        (["a", 1, "b"], (), str, r"key_type str, which a stored key does not fit: 1 \(Expected"),
        (["a"], (("b", 2),), str, r'fit: \["b",2\] \(Expected `str`, got `array`'),
        ([1, "1"], (), int, r'fit: "1" \(Expected `int`, got `str`\)'),
        ([5], (), float, r"fit: 5 \(it reads back as 5.0\)"),
        ([("a", 1)], (), tuple[str, str], r'fit: \["a",1\] \(Expected `str`, got `int`'),
        (["light"], (), Shade, r'fit: "light" \(Invalid enum value'),
    ],
    ids=["int-str", "timer-only", "str-int", "int-float", "tuple", "enum"],
)
def test_undeclared_keys_a_declared_type_would_look_up_otherwise_are_refused(
    env, keys, timer_keys, after, what
) -> None:
    """Fails on the code before (restored: stored 1 was looked up as "1", so each
    such key silently started empty; an int read as float hashed elsewhere).
    timer-only: the misfit key has only a timer stored."""
    handle = _undeclared(env, keys, timer_keys)
    with pytest.raises(
        StateMigrationError, match=rf"operator 'op': its checkpoint holds keys .*{what}"
    ):
        env.backend(key_type=after).restore(env.root, [handle])


@pytest.mark.parametrize(
    ("keys", "after"),
    [
        (["1", "a"], str),
        ([1, 2], int),
        ([1, None], int | None),
        ([("a", 1)], tuple[str, int]),
        (["dark"], Shade),
    ],
    ids=["str-str", "int-int", "int-optional", "tuple", "enum"],
)
def test_undeclared_keys_a_declared_type_reads_unchanged_restore(env, keys, after) -> None:
    r = env.backend(key_type=after)
    r.restore(env.root, [_undeclared(env, keys)])
    decode = msgspec.json.Decoder(after).decode
    for key in keys:
        r.key_context.key = decode(orjson.dumps(key))  # as the declared selector gives it
        assert r.create_state(D).value() == 5, key
    want = sorted(repr(decode(orjson.dumps(k))) for k in keys)
    assert sorted(map(repr, r.keys(EVENT_TIMERS))) == want  # as the timer service reads them


def test_after_a_rescale_each_instance_scans_the_keys_it_restores(env) -> None:
    """Each new instance scans its own key groups: the one with the int key refuses,
    the other restores its str keys and finds them."""
    strs = [f"k{n}" for n in range(40)]
    handle = _undeclared(env, [*strs, 3])
    bad = env.owner(3, 2)
    with pytest.raises(StateMigrationError, match="a stored key does not fit: 3 "):
        env.backend(index=bad, parallelism=2, key_type=str).restore(env.root, [handle])
    good = env.backend(index=1 - bad, parallelism=2, key_type=str)
    good.restore(env.root, [handle])
    mine = [k for k in strs if env.owner(k, 2) != bad]
    assert mine and sorted(good.keys("n")) == sorted(mine)
    for key in mine:
        good.key_context.key = key
        assert good.create_state(D).value() == 5


def test_a_map_key_class_that_gained_a_field_is_refused(env) -> None:
    """Fails on the code before (restored; the grown class encodes a key with "branch":
    of a key's 100 entries, the 36 beyond the 64 loaded whole missed on get(), and a
    put() of one stored a second record beside the old, which a restore read back
    instead). A widened field passes."""
    b = env.backend()
    b.key_context.key = "k"
    b.create_state(MapStateDescriptor("m", Acct, int)).put(Acct("x", 1), 5)
    handle = env.checkpoint(b, 1)
    r = env.backend()
    r.restore(env.root, [handle])
    with pytest.raises(StateMigrationError, match=r"state 'm': its checkpoint holds map Acct keys"):
        r.create_state(MapStateDescriptor("m", AcctGrown, int))
    r = env.backend()
    r.restore(env.root, [handle])
    r.key_context.key = "k"
    assert r.create_state(MapStateDescriptor("m", AcctWide, int)).get(AcctWide("x", 1)) == 5


Tint = enum.Enum("Tint", {"DARK": "dark", "PALE": "pale"})
DarkOnly = enum.Enum("Tint", {"DARK": "dark"})


@pytest.mark.parametrize("key", [Tint.PALE, ("a", Tint.PALE), Tint.DARK])
def test_a_key_enum_that_lost_a_member_a_stored_key_holds_is_refused(env, key) -> None:
    """Fails on the code before (PALE: restored, then keys() failed with
    "a stored key does not fit key_type Tint (Invalid enum value 'pale')"). A key enum
    that lost members makes the restore scan its stored keys; with only DARK stored
    it restores, and the next checkpoint records the job's members (no scan again)."""
    pale = key is not Tint.DARK
    before = tuple[str, Tint] if isinstance(key, tuple) else Tint
    after = tuple[str, DarkOnly] if isinstance(key, tuple) else DarkOnly
    handle = _checkpoint(env, before, key)
    r = env.backend(key_type=after)
    if pale:
        with pytest.raises(StateMigrationError, match=r"Tint keys of members \['pale'\]"):
            r.restore(env.root, [handle])
        return
    r.restore(env.root, [handle])
    r.key_context.key = DarkOnly.DARK
    assert r.create_state(D).value() == 5
    assert list(r.keys("n")) == [DarkOnly.DARK]
    assert env.checkpoint(r, 2)["keys"]["classes"]["Tint"]["members"] == ["dark"]
