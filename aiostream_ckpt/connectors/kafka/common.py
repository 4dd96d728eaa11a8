"""What the Kafka readers and writers share: bounded connects, error mapping.

A job that can't reach its broker must fail at start with one line that names
the cause, not hang in a client's retry loop. aiokafka retries some things
forever (the producer's InitProducerId loop, metadata waits), so every connect
here runs under a deadline and turns into a :class:`ConnectorError`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from aiokafka import errors as kafka_errors
from aiokafka.client import AIOKafkaClient

from aiostream_ckpt.clock import Clock, SystemClock
from aiostream_ckpt.errors import ConnectorError

log = logging.getLogger(__name__)

T = TypeVar("T")

_CLIENT_KEYS = frozenset(inspect.signature(AIOKafkaClient.__init__).parameters) - {
    "self",
    "loop",
    "bootstrap_servers",
}


def client_kwargs(config: Mapping[str, Any]) -> dict[str, Any]:
    """Keep the keys of a consumer/producer config a bare ``AIOKafkaClient`` accepts (TLS, SASL)."""
    return {k: v for k, v in config.items() if k in _CLIENT_KEYS}


def connector_error(what: str, exc: BaseException) -> ConnectorError:
    """Wrap a client error, keeping aiokafka's ``retriable`` verdict."""
    retriable = bool(getattr(exc, "retriable", False)) or isinstance(
        exc, TimeoutError | kafka_errors.KafkaConnectionError
    )
    detail = str(exc) or type(exc).__name__
    return ConnectorError(f"{what}: {type(exc).__name__}: {detail}", retriable=retriable)


async def start_with_deadline(
    make: Callable[[], T],
    start: Callable[[T], Awaitable[None]],
    stop: Callable[[T], Awaitable[None]],
    *,
    bootstrap_servers: str,
    timeout_s: float,
    what: str,
    backoff_s: float = 0.5,
    config: Mapping[str, Any] | None = None,
) -> T:
    """Create and start a client, retrying connection failures until ``timeout_s``.

    A fresh client per attempt: aiokafka's ``start()`` may only be called once.
    Raises a retriable ``ConnectorError`` (one line) when the deadline passes.
    With TLS or SASL in ``config`` (the client's), the first connection
    failure is diagnosed (:func:`diagnose_connection`): wrong credentials or
    an untrusted certificate fail at once, naming the broker and what failed,
    instead of being retried as an unreachable broker.
    """
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    diagnosed = config is None or config.get("security_protocol", "PLAINTEXT") == "PLAINTEXT"
    while True:
        client = bootstrap_to_end(make())
        remaining = deadline - time.monotonic()
        try:
            await asyncio.wait_for(start(client), max(remaining, 0.01))
            return client
        except (kafka_errors.KafkaError, OSError, TimeoutError) as exc:
            last = exc
            await _quiet_stop(stop, client)
            if isinstance(exc, kafka_errors.KafkaError) and not _is_connect_error(exc):
                raise connector_error(f"{what} failed on {bootstrap_servers}", exc) from exc
            if not diagnosed:
                assert config is not None
                diagnosed = True
                problem = await diagnose_connection(bootstrap_servers, config, timeout_s=10.0)
                if problem is not None:
                    raise problem from exc
        except BaseException:
            await _quiet_stop(stop, client)
            raise
        if time.monotonic() + backoff_s >= deadline:
            reason = "timed out" if isinstance(last, TimeoutError) else _short(last)
            raise ConnectorError(
                f"cannot reach Kafka at {bootstrap_servers} within {timeout_s:g}s "
                f"({what}): {reason}",
                retriable=True,
            ) from last
        await asyncio.sleep(backoff_s)


_CONN_KEYS = (
    "security_protocol",
    "ssl_context",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
)


async def diagnose_connection(
    bootstrap_servers: str, config: Mapping[str, Any], *, timeout_s: float
) -> ConnectorError | None:
    """Connect to each bootstrap server as the client would; the error of a TLS or SASL failure.

    Why: aiokafka logs why a connection failed and raises only "Unable to
    bootstrap", which the start loop retries as a broker that is down. A
    certificate nobody trusts or a wrong password does not get better, so it
    is told apart here and raised at once (not retriable), naming the broker,
    the protocol and, for SASL, the mechanism and user (never the password).
    ``None`` when every server is merely unreachable (the retry loop reports
    that) or one accepts the connection.
    """
    import ssl

    from aiokafka.conn import create_conn

    kwargs = {k: config[k] for k in _CONN_KEYS if k in config}
    protocol = kwargs.get("security_protocol", "PLAINTEXT")
    user, mechanism = kwargs.get("sasl_plain_username"), kwargs.get("sasl_mechanism")
    for server in bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            conn = await asyncio.wait_for(
                create_conn(
                    host.strip("[]"), int(port), request_timeout_ms=int(timeout_s * 1000), **kwargs
                ),
                timeout_s,
            )
        except ssl.SSLCertVerificationError as exc:
            return ConnectorError(
                f"Kafka broker {server.strip()} ({protocol}): TLS failed: the broker's certificate "
                f"is not trusted ({exc.verify_message}; set kafka.ssl_cafile to the CA that "
                "signed it)",
                retriable=False,
            )
        except ssl.SSLError as exc:
            return ConnectorError(
                f"Kafka broker {server.strip()} ({protocol}): TLS handshake failed: "
                f"{exc.reason or exc} (is this port a TLS listener?)",
                retriable=False,
            )
        except (
            kafka_errors.SaslAuthenticationFailed,
            kafka_errors.AuthenticationFailedError,
            kafka_errors.IllegalSaslStateError,
        ) as exc:
            return ConnectorError(
                f"Kafka broker {server.strip()} ({protocol}): SASL {mechanism} authentication "
                f"of user {user!r} failed: {_broker_message(exc)}",
                retriable=False,
            )
        except kafka_errors.UnsupportedSaslMechanismError as exc:
            return ConnectorError(
                f"Kafka broker {server.strip()} ({protocol}): SASL mechanism {mechanism} "
                f"refused: {_broker_message(exc)}",
                retriable=False,
            )
        except (OSError, kafka_errors.KafkaError, TimeoutError):
            continue  # unreachable or closed: the start loop retries and reports it
        else:
            conn.close()
            return None
    return None


def _broker_message(exc: BaseException) -> str:
    text = str(exc).strip()
    return text if text and text != "None" else type(exc).__name__


def _is_connect_error(exc: BaseException) -> bool:
    return isinstance(
        exc,
        kafka_errors.KafkaConnectionError
        | kafka_errors.NodeNotReadyError
        | kafka_errors.KafkaTimeoutError
        | kafka_errors.CoordinatorNotAvailableError
        | kafka_errors.NotCoordinatorError
        | kafka_errors.CoordinatorLoadInProgressError,
    )


def _short(exc: BaseException | None) -> str:
    if exc is None:
        return "no attempt"
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")


async def run_to_end(aw: Awaitable[T], *, timeout_s: float | None) -> T:
    """Await ``aw`` to its end even when the caller is cancelled, then re-raise the cancel.

    Why: aiokafka's ``AIOKafkaProducer.stop()`` and ``AIOKafkaConsumer.stop()``
    mark the client closed *before* they flush and close its connections, and
    a second call returns at once. A stop cut short by a cancel (a task
    cancelled while it closes, a recycle cancelled by ``close()``) is never
    finished: its sockets stay open until garbage collection, when asyncio logs
    ``Unclosed AIOKafkaConnection``. So ``aw`` runs in its own task, shielded;
    only ``timeout_s`` (a broker that no longer answers) cancels it
    (``TimeoutError``).
    """
    task = asyncio.ensure_future(aw)
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    cancelled = False
    while not task.done():
        left = None if deadline is None else max(deadline - loop.time(), 0.0)
        try:
            await asyncio.wait({task}, timeout=left)  # a cancel here does not reach ``task``
        except asyncio.CancelledError:
            cancelled = True  # finish the step first
            continue
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if not cancelled:
                raise TimeoutError(f"did not finish within {timeout_s:g}s")
    if cancelled:
        if not task.cancelled() and task.exception() is not None:
            log.warning("Kafka client cleanup failed while cancelled: %r", task.exception())
        raise asyncio.CancelledError
    return task.result()


def bootstrap_to_end(client: T) -> T:
    """Make the bootstrap of ``client`` (a producer, consumer or bare client) run to its end.

    Why: ``AIOKafkaClient.bootstrap()`` holds its bootstrap connection in a
    local while it waits for the metadata answer. A cancel there (a start past
    its deadline on a loaded machine, a producer replacement cancelled by
    ``close()``) leaves a socket that neither the client nor ``stop()`` knows,
    and asyncio logs ``Unclosed AIOKafkaConnection``. The bootstrap is bounded
    by ``request_timeout_ms`` per broker; the cancel is re-raised after it, so
    ``start_with_deadline`` may overrun its deadline by that much.
    """
    inner: Any = client
    if not isinstance(client, AIOKafkaClient):  # AIOKafkaProducer.client, AIOKafkaConsumer._client
        inner = getattr(client, "client", None) or client._client  # type: ignore[attr-defined]
    bootstrap = inner.bootstrap
    inner.bootstrap = lambda: run_to_end(bootstrap(), timeout_s=None)
    return client


async def _quiet_stop(stop: Callable[[T], Awaitable[None]], client: T) -> None:
    try:
        await run_to_end(stop(client), timeout_s=5.0)
    except Exception as exc:  # cleanup after a failed start must not mask its cause
        log.debug("ignoring error while closing a half-started Kafka client: %r", exc)


async def bootstrap_client(
    bootstrap_servers: str, config: Mapping[str, Any], *, timeout_s: float, what: str
) -> Any:
    """Return a bootstrapped ``AIOKafkaClient``, for metadata checks and EndTxn."""

    async def start(c: Any) -> None:
        await c.bootstrap()

    async def stop(c: Any) -> None:
        await c.close()

    return await start_with_deadline(
        lambda: AIOKafkaClient(bootstrap_servers=bootstrap_servers, **client_kwargs(config)),
        start,
        stop,
        bootstrap_servers=bootstrap_servers,
        timeout_s=timeout_s,
        what=what,
        config=config,
    )


#: Seconds between the metadata requests that must all miss a topic before it counts as
#: missing (1.55 s in all): see :func:`require_topics`.
MISSING_TOPIC_WAITS = (0.05, 0.1, 0.2, 0.4, 0.8)


async def require_topics(
    client: Any, topics: Iterable[str], *, bootstrap_servers: str, clock: Clock | None = None
) -> dict[str, list[int]]:
    """Partitions of each topic, sorted; ``ConnectorError`` naming any that is missing.

    Asks for the metadata of *all* topics: a request for a named topic would
    auto-create it on brokers with ``auto.create.topics.enable`` (the default).
    A topic the metadata lacks is asked for again over :data:`MISSING_TOPIC_WAITS`
    of ``clock`` before it counts as missing. Why: CreateTopics answers once
    the controller has the topic, and a broker lists it in the metadata it
    serves a moment later, so a job started right after its topics were
    created (a script, a test) failed for good on a topic that existed (seen
    in a CI run: a sink's topic created just before).
    """
    clock = clock or SystemClock()
    topics = list(topics)
    for wait in (*MISSING_TOPIC_WAITS, None):
        try:
            cluster = await client.fetch_all_metadata()
        except kafka_errors.KafkaError as exc:
            raise connector_error(f"metadata request to {bootstrap_servers} failed", exc) from exc
        out: dict[str, list[int]] = {}
        missing = []
        for topic in topics:
            parts = cluster.partitions_for_topic(topic)
            if not parts:
                missing.append(topic)
            else:
                out[topic] = sorted(parts)
        if not missing:
            return out
        if wait is not None:
            await clock.sleep(wait)
    names = ", ".join(repr(t) for t in missing)
    raise ConnectorError(
        f"Kafka topic {names} does not exist on {bootstrap_servers}", retriable=False
    )


def split_id(topic: str, partition: int) -> str:
    """Name a partition's split in source positions: ``"topic:partition"``."""
    return f"{topic}:{partition}"
