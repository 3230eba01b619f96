"""Server instructions per operation, on the scripts path and the Functions
path: redis-server runs under callgrind (instruction counts do not depend on
what else the machine does), the counters are zeroed before each phase and
dumped after it.

Columns: a PING; the floor (below); an uncontended ``acquire`` +
``release``, and the same with the pool's event log on (``set_events``); a
``renew``; and a handoff: one grant passed from one client to another,
driven step by step in this thread (the waiter's ``acquire`` that queues,
the holder's ``release`` that grants and pushes, the waiter's pop of its
grant and its acknowledgement), so that no reader thread and no heartbeat
adds to it; and the same handoff between clients that keep a presence, as
clients do by default (the scripts check that the waiter is present).

The floor is what a queued, fenced, leased grant costs at the least: two
``FCALL`` of a bare Functions library (``allocator/cli/bench/floor.py``,
whose cycle ``allocator bench`` times as figure 1f; loaded on the same
server, measured the same way) that does only the commands such a grant
needs. Its acquire adds a ticket to a stream (``XADD``, the same four
fields as a ticket of the pool), takes a free resource (``ZPOPMIN``),
draws its next fencing token (``HINCRBY``), reads the clock (``TIME``) and
writes the lease record (``HSET``) and its deadline (``ZADD``); its release
reads the record (``HGET``) and deletes it (``HDEL``), its deadline
(``ZREM``) and its ticket (``XDEL``), and puts the resource back
(``ZADD``). Each call passes the keys it touches and the arguments it
reads, nothing else: no checks, no maintenance, no queue order, no
counters. It shows what the pool's own bookkeeping costs on top (lua/README.md,
"Costs").

The server's timer (``serverCron``, ten times a second) is left out of the
counts (``--toggle-collect``): its work follows the wall clock, so it grew
with the load of the machine (under valgrind a loaded machine runs the same
calls over more seconds). What is left depends only on the calls.

    python docs/scripts/callgrind_cost.py [N] [--path functions|scripts]

Needs valgrind (callgrind_control) and redis-server on PATH. About a minute.
"""

from __future__ import annotations

import glob
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import redis

from allocator import FairAllocator, Lease
from allocator._core.keys import KEY_SUFFIXES
from allocator._core.presence import presence_channel
from allocator._scripts import scripts
from allocator.cli.bench.floor import Floor


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Handoff:
    """Two clients hand one resource back and forth, one grant per call of
    :meth:`once`, each waiter driven through its acquire flow by hand; in
    the order ``order``, each client's requests for its tenant (None: none).
    ``presence``: the clients keep a presence, as a client does by default
    (ids ``p.``, each subscribed to its channel in the pool, so that the
    scripts count it present), rather than plain ids."""

    def __init__(
        self,
        port: int,
        name: str,
        order: str = "fifo",
        tenants: tuple[str | None, ...] = (None, None),
        presence: bool = False,
    ) -> None:
        self.sides = []
        self.channels = []
        for i, tenant in enumerate(tenants):
            client = redis.Redis(port=port)
            named: dict[str, Any] = {} if tenant is None else {"tenant": tenant}
            pool = FairAllocator(client, name, **named)
            cid = f"p.cg-client-{i}" if presence else f"cg-client-{i}"
            if presence:
                channel = redis.Redis(port=port).pubsub()
                channel.ssubscribe(presence_channel(pool._pool, cid))
                channel.get_message(timeout=10)  # the confirmation
                self.channels.append(channel)
            self.sides.append((pool, client, cid))
        first = self.sides[0][0]
        first.extend(["only"])
        if order != "fifo":
            first.set_order(order)
        self.pick = first._pool.keys[KEY_SUFFIXES.index("pick")]
        self.held = first.acquire(timeout=10)
        self.holder = 0
        for _ in range(20):
            self.once()

    def once(self) -> None:
        waiter, client, cid = self.sides[1 - self.holder]
        flow = waiter._pool.acquire(None, None, None, True, cid=cid)
        step = flow.steps.send(None)  # the acquire call: it queues
        step = flow.steps.send(waiter._step(step))  # now it would wait
        self.sides[self.holder][0].release(self.held)  # grants, pushes
        message = client.lpop(waiter._pool.signal_key(cid))
        client.zrem(self.pick, flow.lid)  # what the reader acknowledges
        try:
            flow.steps.send(message)
        except StopIteration as stop:
            self.held = stop.value
        else:
            raise AssertionError("the pushed grant did not end the acquire")
        self.holder = 1 - self.holder


class Callgrind:
    """A redis-server under callgrind, its timer (serverCron, whose work
    follows the wall clock) left out of the counts, and the instructions
    per call of what runs on it; use as a context manager."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.out = tempfile.mkdtemp(prefix="callgrind-")
        self.port = free_port()
        self.server = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--toggle-collect=serverCron", "--collect-atstart=yes",
             f"--callgrind-out-file={self.out}/cg.%p",
             "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        # Under callgrind a call (a library's load) takes longer than usual.
        self.client = redis.Redis(port=self.port, socket_timeout=300)
        for _ in range(300):
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.2)

    def __enter__(self) -> Callgrind:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.terminate()
        self.server.wait()

    def measure(self, run: Callable[[], object]) -> float:
        """The server's instructions per call of ``run``, over ``n`` calls."""
        pid = str(self.server.pid)
        subprocess.run(["callgrind_control", "-z", pid], capture_output=True)
        for _ in range(self.n):
            run()
        subprocess.run(["callgrind_control", "-d", pid], capture_output=True)
        time.sleep(0.5)
        newest = max(glob.glob(f"{self.out}/cg.*"), key=os.path.getmtime)
        with open(newest, encoding="utf-8") as dump:
            for line in dump:
                if line.startswith(("summary:", "totals:")):
                    return int(line.split()[1]) / self.n
        return float("nan")


def main() -> None:
    args = sys.argv[1:]
    paths: tuple[str, ...] = ("scripts", "functions")
    if "--path" in args:
        at = args.index("--path")
        paths = (args[at + 1],)
        del args[at : at + 2]
    n = int(args[0]) if args else 200
    with Callgrind(n) as cg:
        client, port, measure = cg.client, cg.port, cg.measure
        floor_run = Floor(client, "cg-floor:{x}")
        for _ in range(50):
            floor_run.once()
        floor = measure(floor_run.once)
        print(
            f"{'path':<10} {'PING':>8} {'floor':>8} {'acquire+release':>16} {'with the log':>13} "
            f"{'renew':>8} {'handoff':>8} {'with presence':>14}"
            "   (instructions)"
        )
        for path in paths:
            scripts().enabled = path == "functions"
            own = redis.Redis(port=port)
            pool = FairAllocator(own, f"cg-{path}")
            pool.extend(["a", "b"])
            for _ in range(50):
                pool.release(pool.acquire())
            held = pool.acquire()

            def cycle_once(pool: FairAllocator = pool) -> None:
                pool.release(pool.acquire())

            def renew_once(pool: FairAllocator = pool, held: Lease = held) -> None:
                pool.renew(held)

            ping = measure(own.ping)
            cycle = measure(cycle_once)
            pool.set_events(100_000)
            logged = measure(cycle_once)
            pool.set_events(None)
            renew = measure(renew_once)
            pool.release(held)
            handoff = measure(Handoff(port, f"cg-{path}-handoff").once)
            present = measure(Handoff(port, f"cg-{path}-present", presence=True).once)
            print(
                f"{path:<10} {ping:>8,.0f} {floor:>8,.0f} {cycle:>16,.0f} {logged:>13,.0f} "
                f"{renew:>8,.0f} {handoff:>8,.0f} {present:>14,.0f}"
            )
            own.close()


if __name__ == "__main__":
    main()
