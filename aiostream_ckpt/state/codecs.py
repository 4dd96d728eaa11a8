"""Value codecs of keyed state: the bytes a value is stored as, and that it reads back the same.

Why: a value read after a restore must have the type it had when it was
written, or an app behaves differently after a failure than without one (a
``datetime`` coming back as ``str``, a ``tuple`` as ``list``). And a value that
cannot be stored must fail at the ``update()``/``put()``/``add()`` that stored
it, not at the next checkpoint, far from that line. So every state has a codec
that checks each value when it is written:

* **untyped** (the default): JSON, and only values JSON gives back exactly:
  ``int``, ``str``, ``bool``, ``None``, finite ``float``, and ``list``/``dict``
  (``str`` keys) of those. A scalar is checked by a set lookup of its exact
  type (a ``str`` subclass such as a ``StrEnum`` would come back as ``str``):
  ``ValueState.update`` of an int costs what it did. A ``list``/``dict`` is
  encoded anyway (see below), so it is checked by decoding that and comparing
  with the value, in C: a tuple, set, datetime, dataclass, non-``str`` key or
  NaN inside it does not compare equal (a walk in Python over a list of 100
  records cost ~4-10x its encoding). What equality cannot see, an enum
  member (a ``str``/``int`` subclass) *inside* a container, which compares
  equal and comes back as its base class, ``marshal`` does: it writes only
  objects of exact built-in classes (:func:`~.class_check.exact_builtins`,
  in C). Anything else is a :class:`StateTypeError` that names the state
  and the type (and where in the value) and says to declare the type.
* **typed** (the descriptor declares ``value_type``, ``element_type``,
  ``key_type``): msgspec's JSON codec with ``type=``: ``datetime``/``date``/
  ``time``/``timedelta``, ``UUID``, ``Decimal``, ``bytes``, tuples, sets,
  frozensets, dataclasses, enums, ``msgspec.Struct`` and ``typing`` generics
  of these (``dict[str, tuple[int, datetime]]``). The check encodes and decodes
  the value and compares: whatever does not come back equal, of the same
  type and encoding the same is refused; a value equal to nothing (an
  ``eq=False`` dataclass, ``Decimal('NaN')``) passes when its read-back has its
  classes all the way down and its bytes (see :func:`_same_json`). An item of
  another class that compares and encodes the same (an enum member where
  ``str``, ``int`` or ``Any`` is declared, a plain ``"red"`` where a
  ``StrEnum`` is, a ``set`` where ``frozenset`` is, a NamedTuple where
  ``tuple`` is) is found by a check compiled from the declared type
  (:mod:`~aiostream_ckpt.state.class_check`), then located by a walk. JSON, not
  msgpack, because the bytes are the untyped codec's: a checkpoint written
  before a type was declared (by orjson, older versions) restores into the
  declared type.
* **pickle** (``serializer="pickle"``, opt-in: unpickling checkpoint bytes runs
  code): any picklable value; an unpicklable one is refused at the write.

msgspec rather than a hand-written converter: a round trip of a dataclass
record (datetime, tuple, set, enum) took 6.3 us against 17.7 us for orjson
with a hand-written converter (``python -m bench.typed_codec``), and it
validates nested generics the hand-written one would have to spell out.
Untyped values are encoded by msgspec too, because its decoder gives ints
beyond 64 bits back exactly (orjson's gives a float).

A write set holds what :meth:`ValueCodec.capture` returns: the value itself
when it cannot change (an exact scalar), else its encoding as a ``bytearray``
(a type no user value has in a write set, which marks it as already encoded).
"""

from __future__ import annotations

import dataclasses
import pickle
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, get_origin
from uuid import UUID

import msgspec
import orjson

from aiostream_ckpt.errors import StateError, StateMigrationError
from aiostream_ckpt.state.class_check import Check, compile_check, exact_builtins
from aiostream_ckpt.state.serde import decode_key
from aiostream_ckpt.state.type_hints import declared_type_hint

Dumps = Callable[[Any], bytes]
Loads = Callable[[bytes], Any]

#: Types JSON gives back as themselves, held by reference in a write set (they cannot change).
EXACT_SCALARS: frozenset[type] = frozenset({int, str, bool, type(None)})
#: Immutable types pickle keeps by reference (tuples/frozensets when their items are).
_PICKLE_IMMUTABLE: frozenset[type] = frozenset({int, str, float, bool, type(None), bytes})

_json_encode: Dumps = msgspec.json.Encoder().encode
_json_decode: Loads = msgspec.json.Decoder().decode


class StateTypeError(StateError, TypeError):
    """A value a state cannot store so that it reads back the same (raised at the write)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)


def json_misfit(value: Any, where: str = "value") -> str | None:
    """Say where ``value`` holds something JSON would not give back exactly, or None.

    >>> json_misfit({"a": [1, 2.5, None, "x"]}) is None
    True
    >>> json_misfit({"a": [1, (2, 3)]})
    "value['a'][1] is a tuple"
    >>> json_misfit({1: "x"})
    'value has a dict key of type int'
    >>> json_misfit(float("nan"))
    'value is a float that is not finite'
    """
    cls = value.__class__
    if cls in EXACT_SCALARS:
        return None
    if cls is float:
        return None if value - value == 0.0 else f"{where} is a float that is not finite"
    if cls is list:
        for i, item in enumerate(value):
            if item.__class__ not in EXACT_SCALARS and (bad := json_misfit(item, f"{where}[{i}]")):
                return bad
        return None
    if cls is dict:
        for k, item in value.items():
            if k.__class__ is not str:
                return f"{where} has a dict key of type {type(k).__name__}"
            if item.__class__ not in EXACT_SCALARS and (
                bad := json_misfit(item, f"{where}[{k!r}]")
            ):
                return bad
        return None
    if isinstance(value, str | int | float):
        return subclass_misread(where, cls)
    return f"{where} is a {cls.__name__}"


def subclass_misread(where: str, cls: type) -> str:
    """Say that ``where``, of ``cls`` (a ``str``/``int``/``float`` subclass), reads as its base.

    >>> subclass_misread("value[0]", bool)
    'value[0] is of type bool (an int subclass): it would read back as int; declare it as bool'
    """
    base = next(b for b in (str, int, float) if issubclass(cls, b)).__name__
    article = "an" if base == "int" else "a"
    return (
        f"{where} is of type {cls.__name__} ({article} {base} subclass): it would read back "
        f"as {base}; declare it as {cls.__name__}"
    )


def key_misfit(key: Any, where: str = "map key") -> str | None:
    """Like :func:`json_misfit` for untyped map keys: JSON arrays come back as tuples.

    >>> key_misfit(("a", 1)) is None
    True
    >>> key_misfit(("a", 1.0, frozenset()))
    'map key[2] is a frozenset'
    """
    cls = key.__class__
    if cls in EXACT_SCALARS:
        return None
    if cls is tuple:
        for i, item in enumerate(key):
            if bad := key_misfit(item, f"{where}[{i}]"):
                return bad
        return None
    return json_misfit(key, where)


def key_type_error(key: Any, key_bytes: bytes, where: str) -> StateTypeError:
    """Return the error for an undeclared stream key that would not read back the same.

    Why: stored keys are their JSON bytes (the key group hashes them), so a key
    of another type (an enum, a date, a str subclass) would come back as
    another type after a restore, and ``ctx.current_key`` in ``on_timer`` or a
    window's key would differ from a failure-free run's. ``where`` names the
    state or operator that met the key.
    """
    back = decode_key(key_bytes)
    name = type(key).__name__
    return StateTypeError(
        f"{where}: key_by gave a key of type {name} ({key!r}): keyed state stores keys as "
        f"JSON, so after a restore it would come back as {back!r} ({type(back).__name__}). "
        f"Declare the key's type: key_by(selector, key_type={name}) (enums, dates, "
        "datetimes, tuples, frozen dataclasses), or return str, int, bool, None, "
        "finite float or tuples of those from the key selector"
    )


class _NoKey:
    """The class no stream key has: a typed codec checks every key (see ``plain_str``)."""


class StreamKeyCodec:
    """Stream keys: their orjson bytes (what the key group hashes), read back by type.

    Untyped (``key_type`` None): JSON scalars and tuples of them (arrays come
    back as tuples). Declared (``key_by(selector, key_type=Color)``): msgspec
    decodes the same bytes into the type, so an enum, a date or a tuple of
    them hashes to the same key group in every process and comes back as
    itself after a restore (in timers, ``ctx.current_key``, window results).
    """

    __slots__ = ("_classes", "key_type", "loads", "plain_int", "plain_str")

    def __init__(self, key_type: Any = None) -> None:
        self.key_type = key_type
        self.loads: Loads
        if key_type is None:
            self.loads = decode_key
        else:
            self.loads = self._typed_loads(key_type)
        self._classes = None if key_type is None else compile_check(key_type)
        #: key classes that read back the same unchecked: exact str and int when
        #: untyped; none when typed (a class no key has). Two identity tests
        #: skip the check on the hot paths (see :meth:`check_new`).
        untyped = key_type is None
        self.plain_str: type = str if untyped else _NoKey
        self.plain_int: type = int if untyped else _NoKey

    @staticmethod
    def _typed_loads(key_type: Any) -> Loads:
        try:
            decode = msgspec.json.Decoder(key_type).decode
        except TypeError as exc:
            raise StateError(f"key_type {type_name(key_type)} is not supported: {exc}") from exc

        return _migrating(decode, f"a stored key does not fit key_type {type_name(key_type)}")

    def dumps(self, key: Any, where: str) -> bytes:
        """Return ``key``'s bytes (what its key group hashes); refuse one that reads back otherwise.

        ``where`` names the state or operator in the error (``state 'n'``, ``window 'w'``).
        """
        try:
            kb = orjson.dumps(key)
        except TypeError:
            why = key_unencodable(key, "key")
            if self.key_type is None:
                raise StateError(f"{where}: key {key!r} is not serializable ({why})") from None
            raise self._declared_error(key, why, where) from None
        if key.__class__ is not str or self.key_type is not None:
            self.check(key, kb, where)
        return kb

    def check_new(self, key: Any, where: str) -> None:
        """Refuse ``key`` as its first state access would: exact untyped str/int skip it.

        For keys met before any state access that would check them (a write
        without a read, a window buffered until the next barrier).
        """
        cls = key.__class__
        if cls is not self.plain_str and cls is not self.plain_int:
            self.dumps(key, where)

    def check(self, key: Any, key_bytes: bytes, where: str) -> None:
        """Refuse ``key`` (encoded as ``key_bytes``) unless it reads back the same."""
        if self.key_type is None:
            if key.__class__ is not str and key_misfit(key, "key") is not None:
                raise key_type_error(key, key_bytes, where)
            return
        why = _misread(self.loads, key, key_bytes, self._classes)
        if why is not None:
            raise self._declared_error(key, why, where)

    def _declared_error(self, key: Any, why: str, where: str) -> StateTypeError:
        return StateTypeError(
            f"{where}: key_by declared key_type={type_name(self.key_type)}, but the key "
            f"selector gave {key!r} of type {type(key).__name__} ({why})"
        )


UNTYPED_KEYS = StreamKeyCodec()


def _misread(loads: Loads, key: Any, key_bytes: bytes, classes: Check | None) -> str | None:
    """Say how ``key`` (encoded as ``key_bytes``) would read back otherwise, or None.

    ``classes``: the declared type's check (an enum member in a ``tuple[str, int]``
    key is equal, yet reads back as ``str``).
    """
    try:
        back = loads(key_bytes)
    except (msgspec.ValidationError, ValueError, StateMigrationError) as exc:
        return str(exc.__cause__ or exc)
    if back.__class__ is key.__class__ and back == key:
        if classes is None or classes((key,)):
            return None
        return _class_change(back, key, "key")
    return _class_change(back, key, "key") or f"it would read back as {back!r}"


def _migrating(decode: Loads, misfit: str) -> Loads:
    """``decode``, raising StateMigrationError (``misfit``) for bytes written under another type."""

    def loads(raw: bytes) -> Any:
        try:
            return decode(raw)
        except msgspec.ValidationError as exc:
            raise StateMigrationError(
                f"{misfit} ({exc}); it was written under another type"
            ) from exc

    return loads


def type_name(tp: Any) -> str:
    """``datetime``, ``tuple[int, str]``, ``Optional[float]``: a declared type as written."""
    if get_origin(tp) is not None:  # a generic's __name__ is its origin's: "list"
        return repr(tp).replace("typing.", "")
    return getattr(tp, "__name__", None) or repr(tp)


class ValueCodec(ABC):
    """How one state stores its values: ``dumps``/``loads`` and the check at the write."""

    __slots__ = ("dumps", "ints_as_text", "loads", "name")

    def __init__(self, name: str, dumps: Dumps, loads: Loads, *, ints_as_text: bool) -> None:
        self.name = name
        self.dumps = dumps
        self.loads = loads
        #: ``b"%d" % v`` is this codec's encoding of an int (the snapshot's fast path).
        self.ints_as_text = ints_as_text

    @abstractmethod
    def capture(self, value: Any, state: str) -> Any:
        """Return the write-set entry of ``value`` (itself or its encoding); refuse misfits."""

    @abstractmethod
    def check(self, value: Any, state: str) -> None:
        """Refuse ``value`` unless it reads back the same (list elements: stored later)."""


class UntypedJsonCodec(ValueCodec):
    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("json", _json_encode, _json_decode, ints_as_text=True)

    def capture(self, value: Any, state: str) -> Any:
        cls = value.__class__
        if cls in EXACT_SCALARS or (cls is float and value - value == 0.0):
            return value
        if cls is list or cls is dict:
            try:
                raw = _json_encode(value)
            except (msgspec.EncodeError, TypeError, ValueError, OverflowError):
                pass
            else:  # equal, and no str/int/float subclass (an enum member) inside
                items = value if cls is list else (value,)
                if _json_decode(raw) == value and exact_builtins(items):
                    return bytearray(raw)
        raise self._refuse(value, state)

    def check(self, value: Any, state: str) -> None:
        cls = value.__class__
        if cls not in EXACT_SCALARS and not (cls is float and value - value == 0.0):
            self.capture(value, state)

    @staticmethod
    def _refuse(value: Any, state: str) -> StateTypeError:
        bad = json_misfit(value) or "value does not read back equal"
        name = type(value).__name__
        where = "" if bad == f"value is a {name}" else f" ({bad})"
        hint = declared_type_hint(value, lambda tp: _keeps(tp, value, state))
        declare = type_name(hint) if hint is not None else name
        return StateTypeError(
            f"state {state!r}: cannot store a value of type {name}{where}: it would not "
            "read back the same after a restore; an untyped state keeps only int, str, "
            "bool, None, finite float, and list/dict (str keys) of those. Declare the "
            f"type on its descriptor (e.g. ValueStateDescriptor({state!r}, {declare}); "
            "element_type, key_type/value_type for list and map state) or use "
            "serializer='pickle'"
        )


def _keeps(tp: Any, value: Any, state: str) -> bool:
    """Whether a state declared ``tp`` would store ``value`` and read it back the same."""
    TypedJsonCodec(tp, state=state).check(value, state)
    return True


class TypedJsonCodec(ValueCodec):
    """msgspec JSON with a declared type; ``check_type`` is what one value must be."""

    __slots__ = ("_check_decode", "_classes", "_tp")

    def __init__(self, tp: Any, check_type: Any = None, *, state: str = "") -> None:
        try:
            decoder = msgspec.json.Decoder(tp)
            check_decoder = decoder if check_type is None else msgspec.json.Decoder(check_type)
        except TypeError as exc:
            raise StateError(
                f"state {state!r}: type {type_name(tp)} is not supported: {exc}"
            ) from exc
        self._tp = tp if check_type is None else check_type
        self._check_decode = check_decoder.decode
        #: whether a value's items have the classes they read back as (else walked)
        self._classes = compile_check(self._tp)
        loads = _migrating(
            decoder.decode,
            f"state {state!r}: a stored value does not fit the declared type {type_name(tp)}",
        )

        super().__init__(f"json[{type_name(tp)}]", _json_encode, loads, ints_as_text=False)

    def capture(self, value: Any, state: str) -> Any:
        if value is None:
            return None  # clears the state
        return bytearray(self._round_trip(value, state))

    def check(self, value: Any, state: str) -> None:
        self._round_trip(value, state)

    def _round_trip(self, value: Any, state: str) -> bytes:
        try:
            raw = self.dumps(value)
            back = self._check_decode(raw)
        except (msgspec.EncodeError, msgspec.ValidationError, TypeError, ValueError) as exc:
            raise self._refuse(value, state, _unencodable(value) or str(exc)) from exc
        if back.__class__ is not value.__class__:
            raise self._refuse(value, state, _class_change(back, value) or "")
        try:
            equal = back == value
        except ArithmeticError:  # Decimal('sNaN') signals when compared
            equal = False
        # unequal yet maybe the same: an eq=False dataclass equals only itself, a NaN
        # nothing; the same classes all the way down and the same bytes are the same.
        # Equal yet maybe not: an enum member where str is declared (or back)
        classes = self._classes
        if (not equal or (classes is not None and not classes((value,)))) and (
            where := _class_change(back, value)
        ) is not None:
            raise self._refuse(value, state, where)
        if not _same_json(back, value, raw):
            raise self._refuse(value, state, f"it would read back as {back!r}")
        return raw

    def _refuse(self, value: Any, state: str, why: str) -> StateTypeError:
        return StateTypeError(
            f"state {state!r} is declared {type_name(self._tp)}: cannot store a value of "
            f"type {type(value).__name__} ({why})"
        )


#: Classes msgspec encodes only exactly: a subclass instance is refused, by its base's name.
_EXACT_ONLY: tuple[type, ...] = (datetime, date, time, timedelta, Decimal, str, int, float, bytes)


def _unencodable(value: Any, where: str = "value") -> str | None:
    """Say where ``value`` holds an object msgspec cannot encode (a ``Decimal`` subclass...).

    Only on the way to an error: msgspec's own message names the class but not
    where it is, nor that it is a subclass of the class declared.

    >>> class Money(Decimal): ...
    >>> _unencodable({"a": [Decimal(1), Money(2)]})
    "value['a'][1] is of type Money (a Decimal subclass): only Decimal itself can be stored"
    """
    try:
        _json_encode(value)
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError):
        pass
    else:
        return None
    cls = value.__class__
    if cls is dict:
        parts = [(f"{where} key {k!r}", k) for k in value]
        parts += [(f"{where}[{k!r}]", v) for k, v in value.items()]
    elif cls in (list, tuple, set, frozenset) or isinstance(value, tuple):
        parts = [(f"{where}[{i}]", v) for i, v in enumerate(value)]
    else:
        parts = [(f"{where}.{f}", getattr(value, f)) for f in _field_names(cls)]
    for path, item in parts:
        if (found := _unencodable(item, path)) is not None:
            return found
    base = next((b for b in _EXACT_ONLY if issubclass(cls, b) and cls is not b), None)
    if base is None:
        return f"{where} is of type {cls.__name__}, which cannot be stored"
    article = "an" if base is int else "a"
    return (
        f"{where} is of type {cls.__name__} ({article} {base.__name__} subclass): only "
        f"{base.__name__} itself can be stored"
    )


def _same_json(back: Any, value: Any, raw: bytes) -> bool:
    """Whether ``back`` (``raw``, ``value``'s encoding, decoded) encodes as ``value`` does.

    Why: equality cannot see a number that changed class inside a container
    (``(1, 2)`` declared ``tuple[float, int]`` reads back ``(1.0, 2)``, an int
    declared ``Decimal`` as ``Decimal('1')``): equal, yet an app formatting it
    prints ``1.0`` after a restore and ``1`` before. Their encodings differ.
    A set may iterate in another order once rebuilt, so unequal bytes get a
    second, order-free look. Equal bytes and classes stand in for equality
    where ``==`` cannot say (an ``eq=False`` dataclass, ``Decimal('NaN')``).
    What equal bytes cannot see is a class that JSON does not write (a plain
    ``"x"`` in a ``list[StrEnum]``, an enum member in a ``list[str]``): the
    codec's compiled check (:mod:`~aiostream_ckpt.state.class_check`) and
    :func:`_class_change` find it.
    """
    if _json_encode(back) == raw:
        return True
    try:
        return _sorted_encode(back) == _sorted_encode(value)
    except (msgspec.EncodeError, TypeError):
        return False


_sorted_encode: Dumps = msgspec.json.Encoder(order="deterministic").encode


def _class_change(back: Any, value: Any, root: str = "value") -> str | None:
    """Say where ``back`` (``value`` read back) holds another class than ``value``, or None.

    Containers item by item (dict keys too, set elements paired by their
    encoding), dataclasses, attrs classes and ``msgspec.Struct`` field by field.
    """
    path = _changed_at(back, value)
    return None if path is None else root + "".join(reversed(path[1:])) + path[0]


def _changed_at(back: Any, value: Any) -> list[str] | None:
    """:func:`_class_change`'s walk: [what changed, innermost step, ..., outermost step]."""
    cls = value.__class__
    if back.__class__ is not cls:
        if back.__class__ in (str, int, float) and isinstance(value, back.__class__):
            return [subclass_misread("", cls)]
        return [f" is of type {cls.__name__}: it would read back as {back!r}"]
    if cls is list or isinstance(value, tuple):  # a NamedTuple too
        return _items_changed_at(list(back), list(value), lambda i: f"[{i}]")
    if cls is dict:
        keys = list(value)
        return _items_changed_at(list(back), keys, lambda i: f" key {keys[i]!r}") or (
            _items_changed_at(list(back.values()), list(value.values()), lambda i: f"[{keys[i]!r}]")
        )
    if cls is set or cls is frozenset:
        items = list(value)
        by_bytes = {_sorted_encode(b): b for b in back}
        paired = [by_bytes.get(_sorted_encode(v), _MISSING) for v in items]
        return _items_changed_at(paired, items, lambda i: f" element {items[i]!r}")
    fields = _field_names(cls)
    if not fields:
        return None
    return _items_changed_at(
        [getattr(back, f) for f in fields],
        [getattr(value, f) for f in fields],
        lambda i: f".{fields[i]}",
    )


def _items_changed_at(
    backs: list[Any], values: list[Any], step: Callable[[int], str]
) -> list[str] | None:
    """Compare the classes of items in C, and walk into the items that hold more."""
    classes = [*map(type, values)]
    if [*map(type, backs)] == classes and not any(map(_holds_items, {*classes})):
        return None
    for i, (b, v) in enumerate(zip(backs, values, strict=True)):
        if (path := _changed_at(b, v)) is not None:
            path.append(step(i))
            return path
    return None


def _holds_items(cls: type) -> bool:
    return cls in _CONTAINERS or issubclass(cls, tuple) or bool(_field_names(cls))


_CONTAINERS = frozenset({list, dict, set, frozenset})
_MISSING = object()


def _field_names(cls: type) -> tuple[str, ...]:
    """Return the fields msgspec encodes of a dataclass, attrs class or Struct; () for others.

    Cached by class: looking for them on an enum class costs ~10 us (its
    metaclass's ``__getattr__``), more than the rest of a value's check.
    """
    names = _FIELDS.get(cls)
    if names is None:
        if dataclasses.is_dataclass(cls):
            names = tuple(f.name for f in dataclasses.fields(cls))
        elif (struct := getattr(cls, "__struct_fields__", None)) is not None:
            names = tuple(struct)
        else:
            names = tuple(a.name for a in getattr(cls, "__attrs_attrs__", ()))
        _FIELDS[cls] = names
    return names


_FIELDS: dict[type, tuple[str, ...]] = {}


class PickleCodec(ValueCodec):
    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("pickle", _pickle_dumps, pickle.loads, ints_as_text=False)

    def capture(self, value: Any, state: str) -> Any:
        if _pickle_immutable(value):
            return value
        try:
            return bytearray(self.dumps(value))
        except Exception as exc:
            raise StateTypeError(
                f"state {state!r}: cannot pickle a value of type {type(value).__name__}: {exc}"
            ) from exc

    def check(self, value: Any, state: str) -> None:
        if not _pickle_immutable(value):
            self.capture(value, state)


def _pickle_dumps(value: Any) -> bytes:
    return pickle.dumps(value, protocol=5)


def _pickle_immutable(value: Any) -> bool:
    cls = value.__class__
    if cls in _PICKLE_IMMUTABLE:
        return True
    if cls is tuple or cls is frozenset:
        return all(_pickle_immutable(x) for x in value)
    return False


UNTYPED = UntypedJsonCodec()
PICKLE = PickleCodec()


def value_codec(
    serializer: str, tp: Any = None, *, check_type: Any = None, state: str = ""
) -> ValueCodec:
    """Return the codec of a state: ``serializer`` and the declared type (None: untyped)."""
    if serializer == "pickle":
        return PICKLE
    if serializer != "json":
        raise StateError(f"unknown state serializer {serializer!r}")
    return UNTYPED if tp is None else TypedJsonCodec(tp, check_type, state=state)


class MapKeyCodec:
    """Map keys: orjson bytes always (stored keys stay findable), read back by type.

    Untyped keys are JSON scalars and tuples of them (arrays come back as tuples);
    a declared ``key_type`` is decoded by msgspec from the same bytes.
    """

    __slots__ = ("_classes", "_tp", "loads")

    def __init__(self, key_type: Any, untyped_loads: Loads) -> None:
        self._tp = key_type
        self._classes: Check | None = None
        if key_type is None:
            self.loads = untyped_loads
        else:
            try:
                self.loads = msgspec.json.Decoder(key_type).decode
            except TypeError as exc:
                raise StateError(
                    f"map key type {type_name(key_type)} is not supported: {exc}"
                ) from exc
            self._classes = compile_check(key_type)

    def dumps(self, key: Any, state: str) -> bytes:
        """Return ``key``'s bytes (orjson); refuse one orjson cannot encode, saying why."""
        try:
            return orjson.dumps(key)
        except TypeError:
            raise self._refuse(key, state, key_unencodable(key, "map key")) from None

    def check(self, key: Any, key_bytes: bytes, state: str) -> None:
        """Refuse ``key`` (encoded as ``key_bytes``) unless it reads back the same."""
        if self._tp is None:
            why = key_misfit(key)
        else:
            why = _misread(self.loads, key, key_bytes, self._classes)
        if why is not None:
            raise self._refuse(key, state, why)

    def _refuse(self, key: Any, state: str, why: str) -> StateTypeError:
        """Return the error naming the state, the declared key type (if any), the class."""
        name = type(key).__name__
        if self._tp is None:
            return StateTypeError(
                f"state {state!r}: cannot use a map key of type {name} ({why}; untyped map "
                "keys are int, str, bool, None, finite float, tuples); declare key_type on "
                "the MapStateDescriptor"
            )
        return StateTypeError(
            f"state {state!r}: cannot use a map key of type {name} where key_type "
            f"{type_name(self._tp)} is declared ({why})"
        )


#: Classes orjson (the bytes of map and stream keys) encodes only exactly, not a subclass.
_ORJSON_EXACT_ONLY: tuple[type, ...] = (datetime, date, time, UUID)


def key_unencodable(key: Any, where: str) -> str:
    """Say what in ``key`` orjson cannot encode (it names only the class), on the way to an error.

    >>> class Stamp(datetime): ...
    >>> key_unencodable((1, Stamp(2024, 1, 1)), "map key")
    'map key[1] is of type Stamp (a datetime subclass): only datetime itself can be stored'
    """
    cls = key.__class__
    if cls is tuple or cls is list:
        parts = [(f"{where}[{i}]", item) for i, item in enumerate(key)]
    else:
        parts = [(f"{where}.{f}", getattr(key, f)) for f in _field_names(cls)]
    for path, item in parts:
        try:
            orjson.dumps(item)
        except TypeError:
            return key_unencodable(item, path)
    base = next((b for b in _ORJSON_EXACT_ONLY if isinstance(key, b) and cls is not b), None)
    if base is None:
        return f"{where} is of type {cls.__name__}, which cannot be stored"
    return (
        f"{where} is of type {cls.__name__} (a {base.__name__} subclass): only "
        f"{base.__name__} itself can be stored"
    )


def json_encoder(descriptor: Any) -> Callable[[Any], bytes]:
    """Return the json encoding, with its check, of one stored value of ``descriptor``.

    For converting stored values (pickle to json): a list state's value is its
    whole list, checked element by element.
    """
    stored, one = descriptor.value_types()
    codec = value_codec("json", stored, check_type=one, state=descriptor.name)
    name = descriptor.name

    def encode(value: Any) -> bytes:
        if descriptor.kind == "list":
            for item in value:
                codec.check(item, name)
            return codec.dumps(value)
        entry = codec.capture(value, name)
        return bytes(entry) if entry.__class__ is bytearray else codec.dumps(entry)

    return encode
