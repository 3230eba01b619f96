"""The uncontended cycle (``acquire`` + ``release``) of two checkouts of the
library, measured in interleaved batches against one private server, each
beside a PING batch of its own: on a noisy machine only a ratio measured
side by side means something.

    python docs/scripts/interleaved_cycle.py BEFORE_DIR AFTER_DIR
        [--server PATH] [--batches 24] [--cycles 400]

Each checkout runs in a process of its own (``PYTHONPATH`` set to it); the
two take turns, batch by batch, in ABBA order. Printed per checkout: the
medians over the batches of the cycle, of PING, and of their ratio. Set
``ALLOCATOR_FUNCTIONS=0`` to compare the scripts path; ``--server`` picks
another ``redis-server`` (Redis 6.2, Valkey).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time


def worker(port: int, name: str) -> None:
    import redis

    from allocator import FairAllocator

    client = redis.Redis(port=port)
    pool = FairAllocator(client, name)
    pool.extend(["r"])
    for _ in range(300):
        pool.release(pool.acquire(timeout=10))
    for line in sys.stdin:
        n = int(line)
        started = time.perf_counter()
        for _ in range(n):
            pool.release(pool.acquire(timeout=10))
        cycle = (time.perf_counter() - started) / n
        started = time.perf_counter()
        for _ in range(n):
            client.ping()
        ping = (time.perf_counter() - started) / n
        print(f"{cycle * 1e6:.2f} {ping * 1e6:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--server", default="redis-server")
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--cycles", type=int, default=400)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [args.server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(0.5)
    procs = {}
    try:
        for label, path in (("before", args.before), ("after", args.after)):
            env = dict(os.environ, PYTHONPATH=os.path.abspath(path))
            procs[label] = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", str(port), label],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
                cwd=path,
            )
        rows: dict[str, list[tuple[float, float]]] = {label: [] for label in procs}
        for i in range(args.batches):
            order = list(procs) if i % 4 in (0, 3) else list(reversed(procs))
            for label in order:
                proc = procs[label]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(f"{args.cycles}\n")
                proc.stdin.flush()
                cycle, ping = map(float, proc.stdout.readline().split())
                rows[label].append((cycle, ping))
        for label, got in rows.items():
            cycle = statistics.median(c for c, _ in got)
            ping = statistics.median(p for _, p in got)
            ratio = statistics.median(c / p for c, p in got)
            print(f"{label:<7} cycle {cycle:7.1f} us   PING {ping:6.1f} us   ratio {ratio:.2f}")
    finally:
        for proc in procs.values():
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait()
        server.terminate()
        server.wait()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), f"interleaved-{sys.argv[3]}")
    else:
        main()
