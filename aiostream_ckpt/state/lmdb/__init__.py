"""LMDB keyed state backend (see :mod:`aiostream_ckpt.state.lmdb.backend`)."""

from aiostream_ckpt.state.lmdb.backend import LmdbStateBackend, LmdbStateBackendFactory

__all__ = ["LmdbStateBackend", "LmdbStateBackendFactory"]
