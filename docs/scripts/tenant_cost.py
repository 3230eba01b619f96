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

import sys
from typing import Any

import redis
from callgrind_cost import Callgrind, Handoff

from allocator import FairAllocator, load_functions
from allocator._scripts import scripts


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    with Callgrind(n) as cg:
        port, measure = cg.port, cg.measure
        # Loaded ahead: under callgrind a load takes longer than a call's budget.
        load_functions(cg.client)

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


if __name__ == "__main__":
    main()
