"""A TCP proxy that adds a one-way delay: the distance between two local sites.

Three Baton sites on one machine are microseconds apart; `baton bench sites
--local` and the site tests put one of these in front of each site, per
direction, so that a site's probes and forwarded requests cross the round
trip the latency map should measure. Every chunk is held `delay_s` in each
direction, in order, as a link of that length would (no bandwidth limit).
`close()` drops the listener and every open connection: from the other
sites' side, a dead site. Runs in a thread of its own (`DelayProxy.run`),
so synchronous tests and benchmarks can use it.
"""

from __future__ import annotations

import asyncio
import threading
import time

from common.processes import free_ports


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    queue: asyncio.Queue = asyncio.Queue()

    async def deliver() -> None:
        while (item := await queue.get()) is not None:
            due, chunk = item
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(chunk)
            await writer.drain()

    task = asyncio.ensure_future(deliver())
    try:
        while chunk := await reader.read(65536):
            queue.put_nowait((time.monotonic() + delay_s, chunk))
    except (ConnectionError, OSError):
        pass
    finally:
        queue.put_nowait(None)
        try:
            await task
        except (ConnectionError, OSError):
            pass
        writer.close()


class DelayProxy:
    """Listens on 127.0.0.1:`port` and relays to `target_port`, `delay_s` each way."""

    def __init__(self, target_port: int, delay_s: float, port: int | None = None) -> None:
        self.target_port, self.delay_s = target_port, delay_s
        self.port = port or free_ports(1)[0]
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader, writer) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        try:
            await asyncio.gather(_pipe(reader, up_writer, self.delay_s), _pipe(up_reader, writer, self.delay_s))
        finally:
            self._writers -= {writer, up_writer}

    def start(self) -> "DelayProxy":
        """Starts listening (again, after `close`), in a daemon thread with its own loop."""
        ready = threading.Event()

        def run() -> None:
            self.loop = asyncio.new_event_loop()
            self._server = self.loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True))
            ready.set()
            self.loop.run_forever()

        threading.Thread(target=run, daemon=True, name=f"delay-proxy-{self.port}").start()
        ready.wait(10)
        return self

    def close(self) -> None:
        """Stops listening and cuts every open connection; changes nothing else."""
        if self.loop is None:
            return

        async def shut() -> None:
            self._server.close()
            for w in list(self._writers):
                w.close()
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.loop = None
