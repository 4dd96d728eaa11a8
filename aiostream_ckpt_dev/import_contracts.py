"""Import contracts of ``aiostream_ckpt``: dependencies point one way (run by ``make lint``).

Every import of a package module counts, wherever it is written: at the top of
a module, inside a function, or under ``if TYPE_CHECKING:``. An import moved
into a function still couples the two modules; it only hides a cycle from the
interpreter. Two rules:

1. **Layers.** A package imports its own modules and the layers below it:
   never a layer above, nor another package of its own layer, unless the edge
   is listed in ``DEBTS`` with the issue that removes it. A listed edge that
   no import needs any more fails too, so the list only shrinks.
2. **No cycles through deferred imports.** Counting top-level and
   function-local imports, no module reaches itself: a function-local import
   may defer loading (a heavy or optional dependency), never break a cycle.
   Only ``TYPE_CHECKING`` imports (annotations, never executed) may close one.

3. **The engine never imports the dev tooling** (``aiostream_ckpt_dev``).

4. **Inside a package with rooms of its own** (``INNER``: ``runtime``), rule 1
   again, one level down: its sub-packages (*families*: windowing, async I/O,
   two-input operators, worker processes...) and the top-level modules named
   in its layers (``graph``, ``job``: they put the families together) are
   layered; every other top-level module is its *core* (``CORE``), the bottom
   layer. So the core imports no family, nor ``graph`` or ``job``; a family
   imports the core and the families below it, never one beside or above it.

``python -m aiostream_ckpt_dev.import_contracts`` (in ``make lint``) prints
each broken rule and exits 1.
"""

from __future__ import annotations

import ast
import itertools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "aiostream_ckpt"
#: Packages the engine never imports (they import it).
ABOVE = ("aiostream_ckpt_dev",)

#: Top to bottom; a name is a subpackage or a top-level module of the package.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("daemon", "testing"),  # the CLI and service; the testing kit for app authors
    ("api",),  # StreamEnvironment, Stream: builds a jobspec.JobSpec
    ("runtime",),  # runs a JobSpec: tasks, operators, channels, the job runner
    ("time",),  # event time inside the engine: timers, valves, source watermarks
    ("jobspec",),  # the job description that api builds and runtime runs
    ("barrier",),  # alignment: a pure decision per barrier
    ("checkpoint",),  # coordinator, barrier types, storage, metadata
    ("state", "connectors"),
    ("aio", "clock", "durable", "durations", "failpoints", "keygroups", "user_errors"),
    ("objectstore",),  # the S3 client: checkpoint storage and the file sink share it
    ("errors",),
)

#: The bottom layer of a package in ``INNER``: its top-level modules not named in a layer.
CORE = "core"

#: Packages whose own sub-packages and top-level modules are layered (rule 4), top to
#: bottom; a name is a sub-package, a top-level module, or ``CORE``.
INNER: dict[str, tuple[tuple[str, ...], ...]] = {
    "runtime": (
        ("job",),  # job.py: attempts, failover, in this process or in worker processes
        ("workers",),  # an attempt's tasks, built here (attempt.py) or in worker processes
        ("graph",),  # graph.py: plans the chains, builds each family's operator, wires channels
        # windows; map_async; connect().process and broadcast; channels between processes
        # and who runs which subtask; restart strategies, restore order, directory locks
        ("windowing", "async_io", "two_input", "network", "failover"),
        (CORE,),  # tasks, chains, channels, operators, a task's checkpoint and restore
    ),
}

#: Edges the layers forbid that are still there: (importer, imported) -> what removes them.
#: Inside a package of ``INNER`` a name is written ``package/name`` (``runtime/core``).
DEBTS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    deferred: bool  # inside a function
    type_only: bool  # under ``if TYPE_CHECKING:``


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str, modules: set[str]) -> Iterator[Import]:
    """Yield the package modules ``path`` imports, with where each import is written."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def resolve(target: str) -> str | None:
        if target.partition(".")[0] in ABOVE:
            return target
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    def targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        base = node.module or ""
        if node.level:  # relative: from the importer's package up
            up = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*up, base] if base else up)
        return [f"{base}.{a.name}" for a in node.names]

    def walk(node: ast.AST, deferred: bool, type_only: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            d = deferred or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.If) and ast.unparse(child.test).endswith("TYPE_CHECKING"):
                # the body is for the type checker only; an ``else:`` runs
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), d, True)
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), d, type_only)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                for target in targets(child):
                    found = resolve(target)
                    if found is not None and found != name:
                        yield Import(name, found, child.lineno, d, type_only)
            yield from walk(child, d, type_only)

    yield from walk(ast.parse(path.read_text(), str(path)), False, False)


def top(module: str) -> str:
    """Name the layer of ``aiostream_ckpt.x.y``: ``x``."""
    return module.split(".")[1] if "." in module else module


def room(module: str, packages: set[str]) -> str | None:
    """Name the inner layer of ``aiostream_ckpt.p.x[.y]`` (``p`` in ``INNER``): ``p/x``, ``p/core``.

    ``packages`` are the package's sub-packages (``p.x``); None: not inside a package
    of ``INNER``, or its ``__init__`` itself.
    """
    parts = module.split(".")
    if len(parts) < 3 or parts[1] not in INNER:
        return None
    p, x = parts[1], parts[2]
    named = {n for layer in INNER[p] for n in layer}
    if f"{parts[0]}.{p}.{x}" in packages or x in named:
        return f"{p}/{x}"
    return f"{p}/{CORE}"


def check(root: Path) -> list[str]:
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    found = [i for m, p in paths.items() for i in imports_of(p, m, set(paths))]
    rank = {name: n for n, layer in enumerate(LAYERS) for name in layer}
    problems = [
        f"{root.name}/{n}: not in any layer: add it to LAYERS in {Path(__file__).name}"
        for n in sorted({top(m) for m in paths} - set(rank) - {PACKAGE})
    ]
    upward = [i for i in found if i.imported.partition(".")[0] in ABOVE]
    problems += [f"{paths[i.importer]}:{i.line}: the engine imports {i.imported}" for i in upward]
    found = [i for i in found if i not in upward]
    packages = {m for m, p in paths.items() if p.name == "__init__.py"}
    for p, layers in INNER.items():
        rank |= {f"{p}/{name}": n for n, layer in enumerate(layers) for name in layer}
        problems += [
            f"{root.name}/{p}/{x.rpartition('.')[2]}: not in any layer of {p}: "
            f"add it to INNER in {Path(__file__).name}"
            for x in sorted(packages)
            if x.count(".") == 2 and top(x) == p and room(x, packages) not in rank
        ]
    used: set[tuple[str, str]] = set()
    for i in {(i.importer, i.imported, i.line): i for i in found}.values():
        a, b = top(i.importer), top(i.imported)
        if a == b:  # inside one package: its rooms, if it has any (rule 4)
            a, b = room(i.importer, packages) or a, room(i.imported, packages) or b
        if a == b or b == PACKAGE or a not in rank or b not in rank or rank[a] < rank[b]:
            continue
        if (a, b) in DEBTS:
            used.add((a, b))
            continue
        where = "a sibling in its layer" if rank[a] == rank[b] else "a higher layer"
        problems.append(f"{paths[i.importer]}:{i.line}: {a} imports {b} ({where}): {i.imported}")
    problems += [f"DEBTS lists {a} -> {b}, which no import needs now: remove it" for a, b in
                 sorted(set(DEBTS) - used)]  # fmt: skip
    problems += cycles(found, paths)
    return problems


def cycles(found: list[Import], paths: dict[str, Path]) -> list[str]:
    """Report one cycle per strongly connected group of executed imports."""
    graph: dict[str, dict[str, Import]] = {m: {} for m in paths}
    for i in found:
        if i.type_only:
            continue
        # importing a.b.c runs a.b's __init__ too (unless the importer is inside a.b)
        target = i.imported
        while target not in (PACKAGE, i.importer) and not i.importer.startswith(target + "."):
            graph[i.importer].setdefault(target, i)
            target = target.rpartition(".")[0]
    problems: list[str] = []
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        back = _path_back(graph, start)
        if back is None:
            continue
        # the rest of start's group would report the same circle again
        done |= _reach(graph, start) & _reach(_reversed(graph), start)
        hops = [graph[x][y] for x, y in itertools.pairwise(back)]
        shown = " -> ".join(
            f"{h.importer}:{h.line}{' (in a function)' if h.deferred else ''}" for h in hops
        )
        problems.append(f"import cycle: {shown} -> {start}")
    return problems


def _path_back(graph: dict[str, dict[str, Import]], start: str) -> list[str] | None:
    """Return a shortest path of imports from ``start`` back to itself, if any."""
    parent: dict[str, str] = {}
    queue = [start]
    for node in queue:
        for nxt in graph[node]:
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if nxt not in parent:
                parent[nxt] = node
                queue.append(nxt)
    return None


def _reach(graph: dict[str, dict[str, Import]] | dict[str, set[str]], start: str) -> set[str]:
    seen, queue = {start}, [start]
    for node in queue:
        for nxt in graph[node]:
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def _reversed(graph: dict[str, dict[str, Import]]) -> dict[str, set[str]]:
    rev: dict[str, set[str]] = {m: set() for m in graph}
    for m, targets in graph.items():
        for t in targets:
            rev[t].add(m)
    return rev


def main() -> int:
    root = Path(__file__).resolve().parent.parent / PACKAGE
    problems = check(root)
    for p in problems:
        print(p)
    print(f"import contracts: {len(problems)} problem(s)" if problems else "import contracts: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
