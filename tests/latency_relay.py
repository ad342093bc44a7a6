"""A user-space TCP relay that adds one-way latency and limits bandwidth (tests, benchmarks).

Where ``tc qdisc ... netem`` is not available (containers without the
``sch_netem`` module), this relay stands in for a slow network link between a
party and the SuperLink::

    python latency_relay.py --route 10.0.0.1:9000=127.0.0.1:8000 \\
        --delay-ms 20 --rate-mbit 100 --allow 10.0.0.0/24 --lifetime 600

Each ``--route LISTEN=UPSTREAM`` is one link: the relay listens on ``LISTEN``
and forwards every connection to ``UPSTREAM``, both directions. Every chunk
read from one side is written to the other ``--delay-ms`` later (one-way
latency), after the chunks before it on the same link and direction have
been sent at ``--rate-mbit`` (serialisation: a chunk of ``n`` bytes occupies
the link for ``8 n / rate`` seconds; all connections of one link share it, as
on a wire). Chunks are read 16 KiB at a time and queued in a bounded buffer,
so a side that reads slowly slows its sender down (TCP back-pressure), as a
full router buffer would. Both sides run with ``TCP_NODELAY``; the relay's
own chunking is the only batching.

Only these addresses are used: ``LISTEN`` must be loopback or inside an
``--allow`` network, and so must ``UPSTREAM`` (the harness passes the ranges
it gave its own namespaces); anything else is refused before a socket is
opened. Every wait is bounded: connecting upstream (``--connect-timeout``),
a write that the other side does not take (``--write-timeout``), and the
relay's whole life (``--lifetime``; it also stops on SIGTERM/SIGINT). On
exit it writes ``--stats FILE`` (JSON: per route, connections accepted and
bytes in each direction), which tests use to check that the traffic really
went through it.

Standard library only: it runs as a script in a network namespace.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import signal
import socket
import sys
import time

CHUNK = 16 * 1024
#: Chunks buffered per connection and direction before the relay stops reading.
QUEUE_CHUNKS = 64


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def check_allowed(host: str, allowed: list[ipaddress.IPv4Network | ipaddress.IPv6Network],
                  what: str) -> None:
    """Refuse any address that is neither loopback nor in an allowed network."""
    address = ipaddress.ip_address(host)
    if address.is_loopback or any(address in net for net in allowed):
        return
    raise SystemExit(f"latency_relay: {what} {host} is neither loopback nor in "
                     f"{', '.join(map(str, allowed)) or 'an --allow network'}: refused")


class Direction:
    """One direction of one link: its bandwidth and latency, shared by its connections."""

    def __init__(self, delay: float, rate_bps: float | None):
        self.delay, self.rate_bps = delay, rate_bps
        self.free_at = 0.0  # when the link has sent everything queued so far
        self.bytes = 0

    def due(self, nbytes: int, now: float) -> float:
        """When a chunk of ``nbytes`` read at ``now`` arrives at the other end."""
        self.bytes += nbytes
        if self.rate_bps:
            self.free_at = max(self.free_at, now) + 8.0 * nbytes / self.rate_bps
            return self.free_at + self.delay
        return now + self.delay


class Route:
    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int], delay: float,
                 rate_bps: float | None):
        self.listen, self.upstream = listen, upstream
        self.up = Direction(delay, rate_bps)  # client -> upstream
        self.down = Direction(delay, rate_bps)  # upstream -> client
        self.connections = 0
        self.peers: set[str] = set()

    def stats(self) -> dict:
        return {"listen": "{}:{}".format(*self.listen),
                "upstream": "{}:{}".format(*self.upstream),
                "connections": self.connections, "peers": sorted(self.peers),
                "bytes_up": self.up.bytes, "bytes_down": self.down.bytes}


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                direction: Direction, write_timeout: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk delivered when ``direction`` says."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue(QUEUE_CHUNKS)

    async def read() -> None:
        try:
            while True:
                chunk = await reader.read(CHUNK)
                await queue.put((direction.due(len(chunk), loop.time()) if chunk else 0.0,
                                 chunk))
                if not chunk:
                    return
        except (ConnectionError, OSError):
            await queue.put((0.0, b""))

    async def write() -> None:
        while True:
            due, chunk = await queue.get()
            if not chunk:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await asyncio.wait_for(writer.drain(), write_timeout)

    reading = asyncio.ensure_future(read())
    try:
        await write()
    finally:
        reading.cancel()


async def _serve_one(route: Route, reader, writer, connect_timeout: float,
                     write_timeout: float) -> None:
    route.connections += 1
    peer = writer.get_extra_info("peername")
    if peer:
        route.peers.add(peer[0])
    _nodelay(writer)
    try:
        up_reader, up_writer = await asyncio.wait_for(
            asyncio.open_connection(*route.upstream), connect_timeout)
    except (OSError, asyncio.TimeoutError):
        writer.close()
        return
    _nodelay(up_writer)
    tasks = [asyncio.ensure_future(_pump(reader, up_writer, route.up, write_timeout)),
             asyncio.ensure_future(_pump(up_reader, writer, route.down, write_timeout))]
    try:
        # Both directions until both ended (half-closes pass through), or one failed.
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except asyncio.CancelledError:
        pass
    finally:
        for task in tasks:
            task.cancel()
        for w in (writer, up_writer):
            w.close()


async def relay(routes: list[Route], *, lifetime: float, connect_timeout: float,
                write_timeout: float, ready_file: str | None, on_stop=None) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    servers = []
    for route in routes:
        async def handle(reader, writer, route=route):
            try:
                await _serve_one(route, reader, writer, connect_timeout, write_timeout)
            except (ConnectionError, OSError, asyncio.TimeoutError):
                writer.close()
        servers.append(await asyncio.start_server(handle, *route.listen, reuse_address=True))
    if ready_file:
        with open(ready_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(ready_file + ".tmp", ready_file)
    try:
        await asyncio.wait_for(stop.wait(), lifetime)
    except asyncio.TimeoutError:
        pass
    if on_stop is not None:  # first: closing open connections can take a while under load
        on_stop()
    for server in servers:
        server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--route", action="append", required=True,
                        help="LISTEN_HOST:PORT=UPSTREAM_HOST:PORT (repeat for more links)")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way latency")
    parser.add_argument("--rate-mbit", type=float, default=0.0,
                        help="bandwidth per link and direction (0: unlimited)")
    parser.add_argument("--allow", action="append", default=[],
                        help="network whose addresses may be used besides loopback")
    parser.add_argument("--lifetime", type=float, default=600.0, help="stop after S seconds")
    parser.add_argument("--connect-timeout", type=float, default=10.0)
    parser.add_argument("--write-timeout", type=float, default=60.0)
    parser.add_argument("--ready-file", help="written (with the pid) once listening")
    parser.add_argument("--stats", help="JSON file written on exit")
    args = parser.parse_args(argv)
    allowed = [ipaddress.ip_network(net) for net in args.allow]
    rate = args.rate_mbit * 1e6 if args.rate_mbit > 0 else None
    routes = []
    for spec in args.route:
        listen, _, upstream = spec.partition("=")
        listen_at, upstream_at = parse_address(listen), parse_address(upstream)
        check_allowed(listen_at[0], allowed, "listen address")
        check_allowed(upstream_at[0], allowed, "upstream address")
        routes.append(Route(listen_at, upstream_at, args.delay_ms / 1000.0, rate))
    started = time.monotonic()

    def write_stats() -> None:
        if args.stats:
            with open(args.stats + ".tmp", "w") as f:
                json.dump({"seconds": time.monotonic() - started, "delay_ms": args.delay_ms,
                           "rate_mbit": args.rate_mbit,
                           "routes": [r.stats() for r in routes]}, f, indent=1)
            os.replace(args.stats + ".tmp", args.stats)

    try:
        asyncio.run(relay(routes, lifetime=args.lifetime, connect_timeout=args.connect_timeout,
                          write_timeout=args.write_timeout, ready_file=args.ready_file,
                          on_stop=write_stats))
    finally:
        write_stats()  # again, with anything counted while the connections closed
    return 0


if __name__ == "__main__":
    sys.exit(main())
