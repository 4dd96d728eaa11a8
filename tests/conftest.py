"""Settings for every test tier."""

from __future__ import annotations

import os

# Every `aiostream-ckpt run` a test starts serves the REST API; on port 0 each
# picks a free port, so test sessions running side by side never collide on 8081.
os.environ.setdefault("AIOSTREAM_REST__PORT", "0")
