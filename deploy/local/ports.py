#!/usr/bin/env python3
"""A free loopback port for a server to listen on, outside the kernel's ephemeral range.

A port from bind(("127.0.0.1", 0)) is an ephemeral one: between the moment it is picked and
the moment the server binds it (and again after a server killed with -9 is started on the same
port), any outgoing connection of any process may be given it as its local port, and the
server's bind then fails with EADDRINUSE. Ports below the ephemeral range are never handed out
that way. deploy/local/infra.sh takes its stores' ports from 20000-32000; servers started by
the tests, benchmarks and tools take theirs from 10000-19999 (10000-10140 excepted: make up's).

    ports.py          prints one free port
    ports.py N        prints N distinct free ports on one line"""

import random
import socket
import sys

LOW, HIGH = 10200, 19999
_given = set()  # ports this process already handed out (not bound yet by their server)


def _ephemeral():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
            return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_port():
    """A port nobody listens on now, below the ephemeral range, not given before by this
    process. Bound with SO_REUSEADDR, as the servers bind: TIME_WAIT leftovers count as free."""
    lo, hi = _ephemeral()
    for _ in range(2000):
        p = random.randint(LOW, HIGH)
        if p in _given or lo <= p <= hi:
            continue
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                continue
        _given.add(p)
        return p
    raise OSError("no free loopback port in %d-%d" % (LOW, HIGH))


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    print(" ".join(str(free_port()) for _ in range(n)))
