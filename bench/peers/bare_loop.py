"""Ceiling: a plain orjson + dict loop over the JSONL input, the same output lines, no fault tolerance.

Usage: python bare_loop.py INPUT OUTPUT_FILE
"""

from __future__ import annotations

import sys

import orjson


def main(inp: str, out: str) -> None:
    loads, dumps = orjson.loads, orjson.dumps
    counts: dict[str, int] = {}
    buf: list[bytes] = []
    with open(inp, "rb") as f, open(out, "wb") as o:
        for line in f:
            key = loads(line)["app_id"]
            n = counts.get(key, 0) + 1
            counts[key] = n
            buf.append(dumps({"app_id": key, "pv": n}))
            if len(buf) >= 512:
                o.write(b"\n".join(buf) + b"\n")
                buf.clear()
        if buf:
            o.write(b"\n".join(buf) + b"\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
