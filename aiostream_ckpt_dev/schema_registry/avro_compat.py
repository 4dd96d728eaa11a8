"""Avro schema compatibility: whether a reader schema reads what a writer schema wrote.

The stand-in registry (:mod:`.server`) checks a new version against the
subject's compatibility level with these rules, the resolution rules of the
Avro specification ("Schema Resolution") that Confluent's registry applies:

- primitives match, or the writer's promotes to the reader's (int to long,
  float or double; long to float or double; float to double; string and
  bytes either way); logical types ride on their primitive;
- records match by unqualified name; every reader field must be in the
  writer (by name or one of the reader field's aliases) or have a default;
  writer fields the reader lacks are skipped;
- enums match by name; a writer symbol the reader lacks needs a reader default;
- arrays by items, maps by values, fixed by name and size;
- a writer union: each branch must be readable; a reader union: some branch
  must read the writer's type.

Not checked (documented in the stand-in): Avro aliases of named types, and
Protobuf/JSON Schema compatibility (the stand-in accepts those).
"""

from __future__ import annotations

from typing import Any

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}
_NAMED = ("record", "error", "enum", "fixed")


def _fullname(schema: dict[str, Any], namespace: str | None) -> str:
    name = str(schema["name"])
    if "." in name:
        return name
    ns = schema.get("namespace", namespace)
    return f"{ns}.{name}" if ns else name


def named_types(
    schema: Any, namespace: str | None = None, out: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Return every named type of ``schema`` by full name (what a type reference resolves to)."""
    out = {} if out is None else out
    if isinstance(schema, list):
        for branch in schema:
            named_types(branch, namespace, out)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in _NAMED:
            full = _fullname(schema, namespace)
            out[full] = schema
            out.setdefault(full.rpartition(".")[2], schema)
            namespace = full.rpartition(".")[0] or None
            for field in schema.get("fields", ()):
                named_types(field["type"], namespace, out)
        elif kind == "array":
            named_types(schema["items"], namespace, out)
        elif kind == "map":
            named_types(schema["values"], namespace, out)
        elif isinstance(kind, dict | list):
            named_types(kind, namespace, out)
    return out


def incompatibilities(reader: Any, writer: Any) -> list[str]:
    """Say why ``reader`` cannot read data ``writer`` wrote; ``[]`` when it can."""
    checker = _Checker(named_types(reader), named_types(writer))
    return checker.check(reader, writer, "")


class _Checker:
    def __init__(self, reader_names: dict[str, Any], writer_names: dict[str, Any]) -> None:
        self._r = reader_names
        self._w = writer_names
        self._seen: set[tuple[int, int]] = set()

    @staticmethod
    def _resolve(schema: Any, names: dict[str, Any]) -> Any:
        """Follow type references and wrappers to a primitive name, a union or a complex type."""
        while True:
            if isinstance(schema, str):
                if schema in PRIMITIVES:
                    return schema
                if schema not in names:
                    raise ValueError(f"unknown Avro type {schema!r}")
                schema = names[schema]
            elif isinstance(schema, dict):
                kind = schema.get("type")
                if kind in PRIMITIVES:
                    return kind  # a logical type rides on its primitive
                if isinstance(kind, list | dict) or kind not in (*_NAMED, "array", "map"):
                    schema = kind  # {"type": <a schema or a reference>}
                else:
                    return schema
            else:
                return schema

    def check(self, reader: Any, writer: Any, path: str) -> list[str]:
        r = self._resolve(reader, self._r)
        w = self._resolve(writer, self._w)
        here = path or "(top)"
        if isinstance(w, list):
            return [p for branch in w for p in self.check(r, branch, path)]
        if isinstance(r, list):
            if any(not self.check(branch, w, path) for branch in r):
                return []
            return [f"{here}: no branch of the reader's union reads the writer's {_kind(w)}"]
        rk, wk = _kind(r), _kind(w)
        if rk in PRIMITIVES or wk in PRIMITIVES:
            if rk == wk or rk in _PROMOTIONS.get(wk, ()):
                return []
            return [f"{here}: reader {rk} cannot read writer {wk}"]
        if rk != wk and not (rk in ("record", "error") and wk in ("record", "error")):
            return [f"{here}: reader {rk} cannot read writer {wk}"]
        if rk in _NAMED:
            rn, wn = str(r["name"]).rpartition(".")[2], str(w["name"]).rpartition(".")[2]
            if rn != wn:
                return [f"{here}: reader {rk} {rn} does not match writer {rk} {wn}"]
        if rk in ("record", "error"):
            if (id(r), id(w)) in self._seen:  # a recursive type: already being checked
                return []
            self._seen.add((id(r), id(w)))
            return self._record(r, w, path)
        if rk == "enum":
            missing = [s for s in w["symbols"] if s not in r["symbols"]]
            if missing and "default" not in r:
                return [f"{here}: writer enum symbols {missing} unknown to the reader (no default)"]
            return []
        if rk == "fixed":
            if r["size"] != w["size"]:
                return [f"{here}: fixed size {w['size']} written, {r['size']} read"]
            return []
        if rk == "array":
            return self.check(r["items"], w["items"], f"{path}[]")
        if rk == "map":
            return self.check(r["values"], w["values"], f"{path}{{}}")
        return [f"{here}: unknown Avro type {rk}"]

    def _record(self, r: dict[str, Any], w: dict[str, Any], path: str) -> list[str]:
        written = {f["name"]: f for f in w.get("fields", ())}
        problems = []
        for field in r.get("fields", ()):
            names = [field["name"], *field.get("aliases", ())]
            source = next((written[n] for n in names if n in written), None)
            where = f"{path}.{field['name']}" if path else field["name"]
            if source is None:
                if "default" not in field:
                    problems.append(
                        f"{where}: the reader's field has no default and the writer lacks it"
                    )
                continue
            problems += self.check(field["type"], source["type"], where)
        return problems


def _kind(schema: Any) -> str:
    if isinstance(schema, str):
        return schema
    if isinstance(schema, list):
        return "union"
    return str(schema.get("type"))
