"""An asynchronous client of the Confluent Schema Registry REST API: cached, retried, authenticated.

Why our own: Confluent's Python client is synchronous (``httpx``), so every
lookup would block the event loop that runs the job's tasks, and it brings
librdkafka along. The subset used here (register, look up, schema by id,
subject versions, compatibility) is the stable v1 API every registry serves
(Confluent's, Karapace, Apicurio's ``ccompat`` endpoint, Redpanda's).

Caching follows the wire format: a schema id names one schema forever, so a
schema fetched by id is kept for the life of the client; so is the id a
subject gave a schema. Only "latest" answers are asked again. Requests that
fail in a way a retry can fix (connection refused or reset, timeouts, HTTP
5xx, 429) are retried with exponential backoff; a 4xx answer is final and
raised as :class:`SchemaRegistryError` with the registry's ``error_code``.
Credentials (basic auth or a bearer token) are read from the config, the
environment or a file and never appear in errors, logs or ``repr``.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson

from aiostream_ckpt.errors import ConfigError, ConnectorError

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
#: The registry's ``schemaType`` of each format; Avro is the default and is left out.
SCHEMA_TYPES = ("AVRO", "PROTOBUF", "JSON")


class SchemaRegistryError(ConnectorError):
    """The registry answered with an error, or could not be reached in the retries allowed.

    ``status`` is the HTTP status (0: no answer), ``error_code`` the
    registry's own code (40401 subject not found, 40403 schema not found,
    409 incompatible, 42201 invalid schema, ...).
    """

    def __init__(
        self, message: str, *, status: int = 0, error_code: int = 0, retriable: bool = False
    ) -> None:
        super().__init__(message, retriable=retriable)
        self.status = status
        self.error_code = error_code


class SchemaNotFoundError(SchemaRegistryError):
    """No schema has this id, or the subject/version does not exist (HTTP 404)."""


@dataclass(frozen=True, slots=True)
class SchemaReference:
    """A schema this one imports (a Protobuf import, an Avro named type of another subject)."""

    name: str
    subject: str
    version: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "subject": self.subject, "version": self.version}


@dataclass(frozen=True, slots=True)
class Schema:
    """A schema as the registry stores it: its text, type and references."""

    schema: str
    schema_type: str = "AVRO"
    references: tuple[SchemaReference, ...] = ()

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"schema": self.schema}
        if self.schema_type != "AVRO":
            body["schemaType"] = self.schema_type
        if self.references:
            body["references"] = [r.to_json() for r in self.references]
        return body

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Schema:
        refs = tuple(
            SchemaReference(str(r["name"]), str(r["subject"]), int(r["version"]))
            for r in body.get("references") or ()
        )
        return cls(str(body["schema"]), str(body.get("schemaType") or "AVRO"), refs)


@dataclass(frozen=True, slots=True)
class RegisteredSchema:
    """A schema under a subject: its global id and its version there."""

    schema_id: int
    subject: str
    version: int
    schema: Schema


def _secret(value: str | None, file: str | Path | None, env: str | None, what: str) -> str | None:
    if value is not None:
        return value
    if file is not None:
        try:
            return Path(file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read the {what} file {file}: {exc.strerror}") from None
    if env is not None:
        found = os.environ.get(env)
        if found is None:
            raise ConfigError(f"the {what} environment variable {env} is not set")
        return found
    return None


@dataclass(frozen=True)
class SchemaRegistry:
    """Where the registry is and how to log in; each process opens its :meth:`client`.

    ``url``: one or more base URLs, comma-separated (tried in turn on
    connection errors). Authentication: ``basic_auth`` (``"user:password"``,
    Confluent's ``basic.auth.user.info``), or ``bearer_token``; each may
    instead come from a file (``*_file``) or an environment variable
    (``*_env``: its name). ``ssl_cafile`` trusts a private CA for ``https``.
    Retries: ``retries`` more attempts after the first, backoff from
    ``backoff_s`` doubling up to ``max_backoff_s``, each request bounded by
    ``timeout_s``.
    """

    url: str
    basic_auth: str | None = field(default=None, repr=False)
    basic_auth_file: str | Path | None = None
    basic_auth_env: str | None = None
    bearer_token: str | None = field(default=None, repr=False)
    bearer_token_file: str | Path | None = None
    bearer_token_env: str | None = None
    ssl_cafile: str | Path | None = None
    timeout_s: float = 10.0
    retries: int = 4
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0

    def __post_init__(self) -> None:
        urls = self.urls
        if not urls or not all(u.startswith(("http://", "https://")) for u in urls):
            raise ConfigError(f"schema registry url must be http(s)://host:port, got {self.url!r}")
        basic = (self.basic_auth, self.basic_auth_file, self.basic_auth_env)
        bearer = (self.bearer_token, self.bearer_token_file, self.bearer_token_env)
        if sum(x is not None for x in basic) > 1 or sum(x is not None for x in bearer) > 1:
            raise ConfigError("give each schema registry credential one way (value, file or env)")
        if any(x is not None for x in basic) and any(x is not None for x in bearer):
            raise ConfigError("schema registry: basic auth or a bearer token, not both")
        if self.timeout_s <= 0 or self.retries < 0 or self.backoff_s < 0:
            raise ConfigError("schema registry: timeout_s > 0, retries >= 0, backoff_s >= 0")

    @property
    def urls(self) -> list[str]:
        return [u.strip().rstrip("/") for u in self.url.split(",") if u.strip()]

    def authorization(self) -> str | None:
        """Return the ``Authorization`` header (read from its file or env per client)."""
        basic = _secret(
            self.basic_auth, self.basic_auth_file, self.basic_auth_env, "schema registry basic auth"
        )
        if basic is not None:
            if ":" not in basic:
                raise ConfigError("schema registry basic auth must be 'user:password'")
            return "Basic " + base64.b64encode(basic.encode()).decode()
        token = _secret(
            self.bearer_token,
            self.bearer_token_file,
            self.bearer_token_env,
            "schema registry bearer token",
        )
        return None if token is None else f"Bearer {token}"

    def client(self) -> SchemaRegistryClient:
        """Return a client (call from the event loop that uses it; close it when done)."""
        return SchemaRegistryClient(self)


class SchemaRegistryClient:
    """Requests to the registry over one ``aiohttp`` session; see the module docstring."""

    def __init__(self, config: SchemaRegistry) -> None:
        self._config = config
        self._auth = config.authorization()
        self._session: Any = None
        self._by_id: dict[int, Schema] = {}
        self._ids: dict[tuple[str, Schema], RegisteredSchema | int] = {}
        self._locks: dict[Any, asyncio.Lock] = {}
        self._closed = False

    @property
    def url(self) -> str:
        return self._config.url

    async def __aenter__(self) -> SchemaRegistryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # -- the API ------------------------------------------------------------------

    async def schema_by_id(self, schema_id: int) -> Schema:
        """Return the schema with this global id (cached for good: an id never changes)."""
        found = self._by_id.get(schema_id)
        if found is not None:
            return found
        async with self._lock(("id", schema_id)):
            found = self._by_id.get(schema_id)
            if found is None:
                body = await self._request("GET", f"/schemas/ids/{schema_id}")
                found = self._by_id[schema_id] = Schema.from_json(body)
        return found

    async def register(self, subject: str, schema: Schema, *, normalize: bool = False) -> int:
        """Register ``schema`` under ``subject`` (or find it there); return its id."""
        key = (subject, schema)
        cached = self._ids.get(key)
        if cached is not None:
            return cached if isinstance(cached, int) else cached.schema_id
        path = f"/subjects/{quote(subject, safe='')}/versions"
        if normalize:
            path += "?normalize=true"
        body = await self._request("POST", path, schema.to_json())
        schema_id = int(body["id"])
        self._ids[key] = schema_id
        self._by_id.setdefault(schema_id, schema)
        return schema_id

    async def lookup(self, subject: str, schema: Schema) -> RegisteredSchema:
        """Return ``schema``'s id and version under ``subject``; else ``SchemaNotFoundError``."""
        cached = self._ids.get((subject, schema))
        if isinstance(cached, RegisteredSchema):
            return cached
        body = await self._request("POST", f"/subjects/{quote(subject, safe='')}", schema.to_json())
        found = RegisteredSchema(int(body["id"]), subject, int(body["version"]), schema)
        self._ids[(subject, schema)] = found
        self._by_id.setdefault(found.schema_id, schema)
        return found

    async def version(self, subject: str, version: int | str = "latest") -> RegisteredSchema:
        """Return a version of ``subject`` (``"latest"`` is asked every time)."""
        body = await self._request("GET", f"/subjects/{quote(subject, safe='')}/versions/{version}")
        schema = Schema.from_json(body)
        found = RegisteredSchema(int(body["id"]), subject, int(body["version"]), schema)
        self._by_id.setdefault(found.schema_id, schema)
        return found

    async def versions(self, subject: str) -> list[int]:
        """Return the versions registered under ``subject``."""
        return [
            int(v)
            for v in await self._request("GET", f"/subjects/{quote(subject, safe='')}/versions")
        ]

    async def is_compatible(
        self, subject: str, schema: Schema, version: int | str = "latest"
    ) -> bool:
        """Whether ``schema`` may be registered under ``subject`` by its compatibility level."""
        path = f"/compatibility/subjects/{quote(subject, safe='')}/versions/{version}"
        body = await self._request("POST", path, schema.to_json())
        return bool(body["is_compatible"])

    # -- transport ----------------------------------------------------------------

    def _lock(self, key: Any) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    async def _open(self) -> Any:
        if self._closed:
            raise SchemaRegistryError("schema registry client used after close()")
        if self._session is None:
            import ssl

            import aiohttp

            ssl_context: Any = None
            if self._config.ssl_cafile is not None:
                ssl_context = ssl.create_default_context(cafile=str(self._config.ssl_cafile))
            headers = {"Accept": CONTENT_TYPE, "Content-Type": CONTENT_TYPE}
            if self._auth is not None:
                headers["Authorization"] = self._auth
            self._session = aiohttp.ClientSession(
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self._config.timeout_s),
                connector=aiohttp.TCPConnector(ssl=ssl_context) if ssl_context else None,
            )
        return self._session

    async def _request(self, method: str, path: str, body: Any = None) -> Any:
        import aiohttp

        config = self._config
        session = await self._open()
        data = None if body is None else orjson.dumps(body)
        urls = config.urls
        delay = config.backoff_s
        last = ""
        for attempt in range(config.retries + 1):
            url = urls[attempt % len(urls)] + path
            try:
                async with session.request(method, url, data=data) as resp:
                    raw = await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if status < 300:
                    return orjson.loads(raw)
                code, message = _error_of(raw, status)
                if status < 500 and status != 429:
                    kind = SchemaNotFoundError if status == 404 else SchemaRegistryError
                    raise kind(
                        f"schema registry {urls[attempt % len(urls)]}: {method} {path}: "
                        f"HTTP {status} (error {code}): {message}",
                        status=status,
                        error_code=code,
                    )
                last = f"HTTP {status} (error {code}): {message}"
            if attempt < config.retries:
                log.debug("schema registry %s %s failed (%s); retrying", method, path, last)
                await asyncio.sleep(delay * (0.5 + random.random()))  # jitter: no herd
                delay = min(delay * 2, config.max_backoff_s)
        raise SchemaRegistryError(
            f"schema registry {config.url}: {method} {path} failed after "
            f"{config.retries + 1} attempts: {last}",
            retriable=True,
        )


def _error_of(raw: bytes, status: int) -> tuple[int, str]:
    try:
        body = orjson.loads(raw)
        return int(body.get("error_code", status)), str(body.get("message", ""))
    except (orjson.JSONDecodeError, AttributeError, ValueError, TypeError):
        return status, raw[:200].decode(errors="replace")
