"""The load generator's accounting: open-loop latency is counted from the scheduled send time."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

aiohttp_web = pytest.importorskip("aiohttp.web", reason="the bench extra is not installed")

from bench.harness import loadgen  # noqa: E402
from tests.servers.ports import free_ports  # noqa: E402

SERVICE_S = 0.05
# Latencies are held to bounds of a few service times: a busy neighbour worker would stretch them.
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def slow_server() -> Iterator[str]:
    """One request at a time, 50 ms each: a server that falls behind a faster schedule."""
    (port,) = free_ports(1)
    loop = asyncio.new_event_loop()
    lock = asyncio.Lock()

    async def handle(request: aiohttp_web.Request) -> aiohttp_web.Response:
        async with lock:
            await asyncio.sleep(SERVICE_S)
        status = 200 if (await request.read()) != b"bad" else 400
        return aiohttp_web.Response(status=status, text="{}")

    app = aiohttp_web.Application()
    app.router.add_post("/", handle)
    runner = aiohttp_web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(aiohttp_web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_open_loop_charges_the_wait_behind_a_slow_server(slow_server):
    # 20 requests scheduled 25 ms apart against 50 ms of service each: the last one is sent on
    # time but answered ~0.5 s after its schedule. A client timing from the actual send (or a
    # closed loop) would report ~50 ms for every request.
    target = loadgen.Target(slow_server, [b"{}"])
    result = loadgen.open_loop(target, rate=40, seconds=0.5, concurrency=4)
    assert result.ok == 20 and result.errors == 0
    assert result.max_ms > 350
    assert result.p50_ms > 150


def test_closed_loop_is_bounded_and_counts_errors(slow_server):
    target = loadgen.Target(slow_server, [b"{}", b"bad"])
    start = time.monotonic()
    result = loadgen.closed_loop(target, concurrency=2, seconds=30, max_requests=6)
    assert time.monotonic() - start < 5  # the request cap ends it, not the 30 s
    assert result.sent == 6 and result.ok == 3 and result.error_kinds == {"http_400": 3}
    assert 40 < result.p50_ms < 400
