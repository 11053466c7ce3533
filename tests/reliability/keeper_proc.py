"""A tenant-limits keeper in its own process, for keeper_faults.py to kill and stall.

    python -m tests.reliability.keeper_proc PORT

Hosts a admission/quota_keeper.QuotaKeeper behind a loopback socket, as Serve hosts it behind
a handle: one call per connection, a length-prefixed pickle of (method, args) in and of
("ok", answer) | ("error", repr) out. `KeeperHandle` is the ingress side: it looks like a
Serve handle (`handle.admit.remote(...)` is awaitable). Pickle: loopback and tests only.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
import sys
from typing import Any

__all__ = ["KeeperHandle"]

_SIZE = struct.Struct("!I")


async def _read(reader: asyncio.StreamReader) -> Any:
    (size,) = _SIZE.unpack(await reader.readexactly(_SIZE.size))
    return pickle.loads(await reader.readexactly(size))


def _frame(value: Any) -> bytes:
    data = pickle.dumps(value)
    return _SIZE.pack(len(data)) + data


class KeeperHandle:
    """Calls the keeper process on `port` (a new connection per call)."""

    def __init__(self, port: int):
        self.port = port

    def __getattr__(self, method: str) -> Any:
        port = self.port

        class _Method:
            @staticmethod
            async def remote(*args: Any) -> Any:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                try:
                    writer.write(_frame((method, args)))
                    await writer.drain()
                    kind, value = await _read(reader)
                finally:
                    writer.close()
                if kind != "ok":
                    raise RuntimeError(f"keeper {method} failed: {value}")
                return value

        return _Method


async def _serve(port: int) -> None:
    from agentserve.admission.quota_keeper import QuotaKeeper

    keeper = QuotaKeeper()

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            method, args = await _read(reader)
            try:
                answer = ("ok", await getattr(keeper, method)(*args))
            except Exception as err:  # reported to the caller, as Serve does
                answer = ("error", repr(err))
            writer.write(_frame(answer))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the caller gave up (its timeout)
        finally:
            writer.close()

    server = await asyncio.start_server(one, "127.0.0.1", port, reuse_address=True, backlog=512)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1])))
