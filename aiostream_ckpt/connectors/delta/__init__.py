"""Delta Lake output (the ``delta`` extra): see :mod:`.sink`."""

from aiostream_ckpt.connectors.delta.sink import DeltaSink

__all__ = ["DeltaSink"]
