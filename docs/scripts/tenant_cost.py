"""Server instructions per operation in each order of a pool
(docs/concepts.md#tenants): redis-server runs under callgrind, whose
counts do not depend on what else the machine does.

Columns, on the Functions path and on the scripts path: an uncontended
``acquire`` + ``release`` in the order ``fifo`` and in the order
``tenant``; a handoff (one grant passed from one client to the other,
driven step by step in this thread: the waiter's ``acquire`` that queues,
the holder's ``release`` that grants and pushes, the waiter's pop of its
grant and its acknowledgement) in the order ``fifo``, in ``fifo`` with
requests that name tenants, and in ``tenant`` with one tenant and with
two.

    python docs/scripts/tenant_cost.py [N]

Needs valgrind (callgrind_control) and redis-server on PATH. A few
minutes. Run it on two trees (``PYTHONPATH=<tree>``) for a before and
after: from one run to the next the counts move by about 1 % with the
server's state, so compare means of a few runs, taken in turn.
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

from allocator import FairAllocator, load_functions
from allocator._core.keys import KEY_SUFFIXES
from allocator._scripts import scripts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Handoff:
    """Two clients hand one resource back and forth, one grant per call of
    :meth:`once`, each waiter driven through its acquire flow by hand; in
    the order ``order``, each client's requests for its tenant (None: none)."""

    def __init__(self, port: int, name: str, order: str, tenants: tuple[str | None, ...]) -> None:
        self.sides = []
        for i, tenant in enumerate(tenants):
            client = redis.Redis(port=port)
            named: dict[str, Any] = {} if tenant is None else {"tenant": tenant}
            self.sides.append((FairAllocator(client, name, **named), client, f"cg-client-{i}"))
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


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    out = tempfile.mkdtemp(prefix="callgrind-")
    port = free_port()
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p",
         "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        client = redis.Redis(port=port, socket_timeout=300)
        for _ in range(300):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.2)
        # Loaded ahead: under callgrind a load takes longer than a call's budget.
        load_functions(client)

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

        columns = (
            "cycle fifo",
            "cycle tenant",
            "handoff fifo",
            "fifo, named",
            "tenant, 1",
            "tenant, 2",
        )
        print(f"{'path':<10}" + "".join(f"{c:>14}" for c in columns) + "   (instructions)")
        for path in ("functions", "scripts"):
            scripts().enabled = path == "functions"
            own = redis.Redis(port=port)
            cycles = []
            for order, tenant in (("fifo", None), ("tenant", "t")):
                named: dict[str, Any] = {} if tenant is None else {"tenant": tenant}
                pool = FairAllocator(own, f"cg-{path}-{order}", **named)
                pool.extend(["a", "b"])
                if order != "fifo":
                    pool.set_order(order)
                for _ in range(50):
                    pool.release(pool.acquire())

                def cycle_once(pool: FairAllocator = pool) -> None:
                    pool.release(pool.acquire())

                cycles.append(measure(cycle_once))
            handoffs = [
                measure(Handoff(port, f"cg-{path}-h{i}", order, tenants).once)
                for i, (order, tenants) in enumerate(
                    [
                        ("fifo", (None, None)),
                        ("fifo", ("a", "b")),
                        ("tenant", ("a", "a")),
                        ("tenant", ("a", "b")),
                    ]
                )
            ]
            print(f"{path:<10}" + "".join(f"{x:>14,.0f}" for x in (*cycles, *handoffs)))
            own.close()
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
