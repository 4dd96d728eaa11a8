"""The project's dev tooling, kept apart from the engine in ``aiostream_ckpt``.

What is here proves and shows the engine; none of it runs inside a job:

- ``broker/``: a real local Kafka broker (Maven-resolved jars, the JVM
  process, ``aiostream-ckpt broker start|stop|status``);
- ``kafka_wire.py``: the one hand-written Kafka wire codec (framing, the
  broker's Metadata readiness probe, ListOffsets for the bench);
- ``demo/``: ``aiostream-ckpt demo`` (file sink) and ``demo-kafka``;
- ``chaos/``: kill -9 harnesses, fault injection, ``aiostream-ckpt chaos``
  and ``make chaos``;
- ``validate/``: the PySpark checks and the reference-run proof
  (``aiostream-ckpt validate``);
- ``recount.py``, ``lookup_service.py``, ``maven.py``: the Python recount the
  demos check against, the enrich app's toy HTTP service, Maven resolution;
- ``import_contracts.py``: the layers of ``aiostream_ckpt`` (``make lint``).

Dependencies point one way: this package imports ``aiostream_ckpt``; the
engine never imports it. The one bridge is the CLI, which names these
commands by module path and imports them only when one is run.
"""
