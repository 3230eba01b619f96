"""Server instructions per operation, on the scripts path and the Functions
path: redis-server runs under callgrind (instruction counts do not depend on
what else the machine does), the counters are zeroed before each phase and
dumped after it.

Columns: a PING; an uncontended ``acquire`` + ``release``, and the same
with the pool's event log on (``set_events``); a ``renew``; and a
handoff: one grant passed from one client to another, driven step by step
in this thread (the waiter's ``acquire`` that queues, the holder's
``release`` that grants and pushes, the waiter's pop of its grant and its
acknowledgement), so that no reader thread and no heartbeat adds to it.

    python docs/scripts/callgrind_cost.py [N]

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

import redis

from allocator import FairAllocator, Lease
from allocator._core.keys import KEY_SUFFIXES
from allocator._scripts import scripts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Handoff:
    """Two clients hand one resource back and forth, one grant per call of
    :meth:`once`, each waiter driven through its acquire flow by hand."""

    def __init__(self, port: int, name: str) -> None:
        self.sides = [
            (FairAllocator(client, name), client, f"cg-client-{i}")
            for i, client in enumerate((redis.Redis(port=port), redis.Redis(port=port)))
        ]
        self.sides[0][0].extend(["only"])
        self.pick = self.sides[0][0]._pool.keys[KEY_SUFFIXES.index("pick")]
        self.held = self.sides[0][0].acquire(timeout=10)
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


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    out = tempfile.mkdtemp(prefix="callgrind-")
    port = free_port()
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p",
         "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        client = redis.Redis(port=port)
        for _ in range(300):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.2)

        def measure(run: Callable[[], object]) -> float:
            subprocess.run(["callgrind_control", "-z", str(server.pid)], capture_output=True)
            for _ in range(n):
                run()
            subprocess.run(["callgrind_control", "-d", str(server.pid)], capture_output=True)
            time.sleep(0.5)
            newest = max(glob.glob(f"{out}/cg.*"), key=os.path.getmtime)
            with open(newest, encoding="utf-8") as dump:
                for line in dump:
                    if line.startswith(("summary:", "totals:")):
                        return int(line.split()[1]) / n
            return float("nan")

        print(
            f"{'path':<10} {'PING':>8} {'acquire+release':>16} {'with the log':>13} "
            f"{'renew':>8} {'handoff':>8}"
            "   (instructions)"
        )
        for path in ("scripts", "functions"):
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
            print(
                f"{path:<10} {ping:>8,.0f} {cycle:>16,.0f} {logged:>13,.0f} {renew:>8,.0f} "
                f"{handoff:>8,.0f}"
            )
            own.close()
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
