"""A stand-in for the Confluent Schema Registry, for tests and the demo: in memory, on loopback.

**A stand-in, not a registry.** No server speaking the Confluent Schema
Registry API installs from the package registries this project builds from
(Karapace is not on PyPI; Confluent's registry and Apicurio do not resolve
from Maven Central), so the tests run the registry client and the formats
against this: the part of the REST API v1 that clients use, with the same
paths, bodies, status and error codes. Schema ids are global and stable (the
same schema under two subjects has one id), versions count per subject, and a
new version must be compatible with the subject's level (BACKWARD by default):
for Avro by the resolution rules of :mod:`.avro_compat`; Protobuf and JSON
Schema versions are accepted unchecked. The wire format is proven against
Confluent's own serializers pointed at this server
(``tests/integration/kafka/test_confluent_interop.py``): the bytes are theirs.

Endpoints: ``POST /subjects/{s}/versions`` (register), ``POST /subjects/{s}``
(look up), ``GET /schemas/ids/{id}``, ``GET /subjects``, ``GET
/subjects/{s}/versions``, ``GET /subjects/{s}/versions/{v|latest}``, ``POST
/compatibility/subjects/{s}/versions/{v|latest}``, ``GET|PUT /config`` and
``/config/{s}``. Optional basic auth (``users``) or bearer ``token``;
:meth:`SchemaRegistryStandIn.fail_next` answers the next requests with an
error, to test retries.
"""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit

from aiostream_ckpt_dev.schema_registry.avro_compat import incompatibilities

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)


class _Fail(Exception):
    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class _Stored:
    schema: str
    schema_type: str
    references: list[dict[str, Any]]

    def key(self) -> tuple[str, str, str]:
        text = self.schema
        if self.schema_type in ("AVRO", "JSON"):
            text = json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
        return (self.schema_type, text, json.dumps(self.references, sort_keys=True))

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": self.schema}
        if self.schema_type != "AVRO":
            out["schemaType"] = self.schema_type
        if self.references:
            out["references"] = self.references
        return out


@dataclass
class _State:
    schemas: dict[int, _Stored] = field(default_factory=dict)
    ids: dict[tuple[str, str, str], int] = field(default_factory=dict)
    subjects: dict[str, list[int]] = field(default_factory=dict)  # versions -> schema ids
    levels: dict[str, str] = field(default_factory=dict)
    level: str = "BACKWARD"
    failures: list[int] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _parse(body: Any) -> _Stored:
    if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
        raise _Fail(422, 42201, "body must have a string 'schema'")
    kind = str(body.get("schemaType") or "AVRO")
    if kind not in ("AVRO", "PROTOBUF", "JSON"):
        raise _Fail(422, 42201, f"unknown schemaType {kind}")
    stored = _Stored(body["schema"], kind, list(body.get("references") or []))
    try:
        if kind == "AVRO":
            import fastavro

            fastavro.parse_schema(json.loads(stored.schema), _write_hint=False)
        elif kind == "JSON":
            json.loads(stored.schema)
        else:
            from google.protobuf import descriptor_pb2

            descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(stored.schema))
    except Exception as exc:
        raise _Fail(422, 42201, f"Invalid schema: {type(exc).__name__}: {exc}") from None
    return stored


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet: tests read their own output
        return

    def _answer(self, status: int, body: Any) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _serve(self, method: str) -> None:
        stand_in = self.server.stand_in
        state = stand_in.state
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = urlsplit(self.path).path
        with state.lock:
            state.requests.append((method, path))
            failure = state.failures.pop(0) if state.failures else None
        if failure is not None:
            self._answer(failure, {"error_code": failure, "message": "injected failure"})
            return
        if not stand_in.authorized(self.headers.get("Authorization")):
            self._answer(401, {"error_code": 401, "message": "Unauthorized"})
            return
        try:
            body = json.loads(raw) if raw else None
            parts = [unquote(p) for p in path.strip("/").split("/")]
            with state.lock:
                self._answer(200, stand_in.route(method, parts, body))
        except _Fail as exc:
            self._answer(exc.status, {"error_code": exc.code, "message": exc.message})
        except json.JSONDecodeError:
            self._answer(400, {"error_code": 400, "message": "body is not JSON"})

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    stand_in: SchemaRegistryStandIn


class SchemaRegistryStandIn:
    """The stand-in registry on ``127.0.0.1`` (a free port unless given); a context manager."""

    def __init__(
        self,
        *,
        port: int = 0,
        users: dict[str, str] | None = None,
        token: str | None = None,
    ) -> None:
        self.state = _State()
        self._users = dict(users or {})
        self._token = token
        self._port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "stand-in registry not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> SchemaRegistryStandIn:
        if self._server is None:
            server = _Server(("127.0.0.1", self._port), _Handler)
            server.stand_in = self
            self._server = server
            self._thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.05},  # stop() waits for a poll
                name="schema-registry-stand-in",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> SchemaRegistryStandIn:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def fail_next(self, count: int, status: int = 503) -> None:
        """Answer the next ``count`` requests with HTTP ``status`` (retries, outages)."""
        with self.state.lock:
            self.state.failures.extend([status] * count)

    def authorized(self, header: str | None) -> bool:
        if not self._users and self._token is None:
            return True
        if header is None:
            return False
        scheme, _, value = header.partition(" ")
        if scheme == "Bearer" and self._token is not None:
            return value == self._token
        if scheme == "Basic" and self._users:
            user, _, password = base64.b64decode(value).decode().partition(":")
            return self._users.get(user) == password
        return False

    # -- the API ----------------------------------------------------------------------

    def route(self, method: str, parts: list[str], body: Any) -> Any:
        state = self.state
        match (method, parts):
            case ("GET", ["schemas", "ids", wanted]):
                stored = state.schemas.get(int(wanted))
                if stored is None:
                    raise _Fail(404, 40403, f"Schema {wanted} not found")
                return stored.body()
            case ("GET", ["subjects"]):
                return sorted(state.subjects)
            case ("GET", ["subjects", subject, "versions"]):
                return list(range(1, len(self._versions(subject)) + 1))
            case ("GET", ["subjects", subject, "versions", version]):
                number, sid = self._version(subject, version)
                return {
                    "subject": subject,
                    "version": number,
                    "id": sid,
                    **state.schemas[sid].body(),
                }
            case ("POST", ["subjects", subject, "versions"]):
                return {"id": self._register(subject, _parse(body))}
            case ("POST", ["subjects", subject]):
                stored = _parse(body)
                known = state.ids.get(stored.key())
                versions = self._versions(subject)
                if known is None or known not in versions:
                    raise _Fail(404, 40403, "Schema not found")
                number = versions.index(known) + 1
                return {"subject": subject, "version": number, "id": known, **stored.body()}
            case ("POST", ["compatibility", "subjects", subject, "versions", version]):
                stored = _parse(body)
                if subject not in state.subjects:
                    return {"is_compatible": True}
                number, _ = self._version(subject, version)
                problems = self._problems(subject, stored, upto=number)
                return {"is_compatible": not problems, "messages": problems}
            case ("GET", ["config"]):
                return {"compatibilityLevel": state.level}
            case ("GET", ["config", subject]):
                if subject not in state.levels:
                    raise _Fail(404, 40408, f"Subject '{subject}' has no compatibility level")
                return {"compatibilityLevel": state.levels[subject]}
            case ("PUT", ["config", *rest]):
                level = str((body or {}).get("compatibility", "")).upper()
                if level not in LEVELS:
                    raise _Fail(422, 42203, f"Invalid compatibility level {level!r}")
                if rest:
                    state.levels[rest[0]] = level
                else:
                    state.level = level
                return {"compatibility": level}
        raise _Fail(404, 404, f"HTTP 404 Not Found: {method} /{'/'.join(parts)}")

    def _versions(self, subject: str) -> list[int]:
        versions = self.state.subjects.get(subject)
        if not versions:
            raise _Fail(404, 40401, f"Subject '{subject}' not found.")
        return versions

    def _version(self, subject: str, version: str) -> tuple[int, int]:
        versions = self._versions(subject)
        number = len(versions) if version in ("latest", "-1") else int(version)
        if not 1 <= number <= len(versions):
            raise _Fail(404, 40402, f"Version {version} not found.")
        return number, versions[number - 1]

    def _register(self, subject: str, stored: _Stored) -> int:
        state = self.state
        sid = state.ids.get(stored.key())
        versions = state.subjects.setdefault(subject, [])
        if sid is not None and sid in versions:
            return sid
        problems = self._problems(subject, stored, upto=len(versions))
        if problems:
            del_if_empty = not versions
            if del_if_empty:
                del state.subjects[subject]
            raise _Fail(
                409,
                409,
                "Schema being registered is incompatible with an earlier schema for subject "
                f'"{subject}": {"; ".join(problems)}',
            )
        if sid is None:
            sid = len(state.schemas) + 1
            state.schemas[sid] = stored
            state.ids[stored.key()] = sid
        versions.append(sid)
        return sid

    def _problems(self, subject: str, new: _Stored, *, upto: int) -> list[str]:
        """Why ``new`` may not follow versions ``1..upto`` of ``subject`` at its level."""
        level = self.state.levels.get(subject, self.state.level)
        versions = self.state.subjects.get(subject, [])[:upto]
        if level == "NONE" or not versions or new.schema_type != "AVRO":
            return []
        olds = versions if level.endswith("TRANSITIVE") else versions[-1:]
        reader_new = level.startswith(("BACKWARD", "FULL"))
        writer_new = level.startswith(("FORWARD", "FULL"))
        schema = json.loads(new.schema)
        problems = []
        for sid in olds:
            old = self.state.schemas[sid]
            if old.schema_type != "AVRO":
                problems.append(f"version with id {sid} is {old.schema_type}, not AVRO")
                continue
            old_schema = json.loads(old.schema)
            if reader_new:
                problems += [f"{level}: {p}" for p in incompatibilities(schema, old_schema)]
            if writer_new:
                problems += [f"{level}: {p}" for p in incompatibilities(old_schema, schema)]
        return problems
