"""A loopback HTTP proxy that gives an object store's test server a real store's manners: time to first byte,
throttling and dropped connections.

The proxy's process, started by :class:`~bench.peers.store_proxy.client.StoreProxy`: a
:class:`~bench.peers.store_proxy.server.ProxyServer` driven over stdin and stdout, one JSON object a line.
"""

from __future__ import annotations

import argparse
import base64
import json
import pickle
import sys
from typing import Callable

from bench.peers.store_proxy.faults import Match
from bench.peers.store_proxy.server import HOST, ProxyServer


def _unpickled(match: str | None) -> Match | None:
    return None if match is None else pickle.loads(base64.b64decode(match))


#: What the proxy's process does with each command that comes on its stdin (one JSON object a line): the value it
#: answers with on its stdout.
COMMANDS: dict[str, Callable[..., object]] = {
    "latency": lambda proxy, seconds: setattr(proxy, "latency_s", seconds),
    "fail": lambda proxy, count, status, body, headers, match: proxy.fail_next(
        count, status, base64.b64decode(body), headers, _unpickled(match)),
    "drop": lambda proxy, count, match: proxy.drop_next(count, _unpickled(match)),
    "clear": lambda proxy: proxy.clear_faults(),
    "counts": lambda proxy: proxy.counts(),
    "recent": lambda proxy: proxy.recent,
}


def run_command(proxy: ProxyServer, line: bytes) -> dict | None:
    """``{"value": ...}``, or ``{"error": ...}`` where the command failed; None for ``close``."""
    try:
        args = json.loads(line)
        if args.get("command") == "close":
            return None
        return {"value": COMMANDS[args.pop("command")](proxy, **args)}
    except Exception as e:          # a bad command or argument is the caller's error, not the proxy's end
        return {"error": f"{type(e).__name__}: {e}"}


def main(argv=None) -> int:
    """Serves until stdin ends or says ``{"command": "close"}`` (the :class:`StoreProxy` that started it closes, or
    exits), answering each other command, a JSON line on stdin, with one on stdout (``{"value": ...}`` or
    ``{"error": ...}``); the first line out is the address it listens on."""
    p = argparse.ArgumentParser(prog="python -m bench.peers.store_proxy", description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True, help="the server, host:port")
    p.add_argument("--host", default=HOST)
    p.add_argument("--port", type=int, default=0, help="0: a free port")
    p.add_argument("--latency", type=float, default=0.0, help="seconds before each answer's first byte")
    args = p.parse_args(argv)
    out, sys.stdout = sys.stdout.buffer, sys.stderr         # stdout carries the answers and nothing else
    with ProxyServer(args.upstream, latency_s=args.latency, host=args.host, port=args.port) as proxy:
        _answer(out, {"host": proxy.host, "port": proxy.port})
        for line in sys.stdin.buffer:
            if (reply := run_command(proxy, line)) is None:
                break
            _answer(out, reply)
    return 0


def _answer(out, reply: dict):
    out.write(json.dumps(reply).encode() + b"\n")
    out.flush()


if __name__ == "__main__":
    sys.exit(main())
