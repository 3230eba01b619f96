"""Where a contended grant's client CPU goes (docs/performance.md, "The
waiter reads its own grant"): per grant, the CPU
of the worker processes, and py-spy's samples of one worker split into
redis-py, the library and the rest (the interpreter, the standard library),
on CPU and holding the GIL.

    python docs/scripts/grant_profile.py                  # 8 processes, 2 resources, 8 s
    python docs/scripts/grant_profile.py --procs 32 --resources 8
    PYTHONPATH=/path/to/other/checkout python docs/scripts/grant_profile.py   # another version

A private redis-server from PATH. Each worker process loops: acquire, hold
1 ms, release (as ``allocator bench``'s throughput run). py-spy (``pip install
py-spy``; skipped without it) samples worker 0 twice at once: its threads on
CPU (``py-spy record``), and its thread holding the GIL (``--gil``). A
thread that is runnable but waits for the GIL is off CPU in the first and
absent from the second; a process whose threads hand each grant over (a
reader thread that pops it, the waiting thread that takes it) shows the
hand-over as the extra threads' samples. Samples are counted by the
innermost frame that is in redis-py or in the library, else "other".
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import queue
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, ClassVar

import redis

import allocator
from allocator import FairAllocator
from allocator._server import RedisServer


class _TimedInbox(queue.SimpleQueue):  # type: ignore[type-arg]
    """A waiter's inbox that records, per item, the time from put to get:
    a grant handed from the thread that read it to the waiting thread."""

    hops: ClassVar[list[int]] = []

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        self._at = time.perf_counter_ns()
        super().put(item, block, timeout)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        item = super().get(block, timeout)
        self.hops.append(time.perf_counter_ns() - self._at)
        return item

    def get_nowait(self) -> Any:
        return self.get(False)


def worker(url: str, name: str, start: Any, stop: Any, out: Any, profile: bool = False) -> None:
    queue.SimpleQueue = _TimedInbox  # type: ignore[misc]  # the inboxes of this process
    client = redis.Redis.from_url(url)
    pool = FairAllocator(client, name)
    start.wait()
    if profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
    before = resource.getrusage(resource.RUSAGE_SELF)
    grants = 0
    while not stop.is_set():
        lease = pool.acquire(timeout=30)
        time.sleep(0.001)
        pool.release(lease)
        grants += 1
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if profile:
        profiler.disable()
        print(f"cProfile of one worker ({grants} grants; its CPU inflated by the profiler):")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    out.put((os.getpid(), grants, cpu, _TimedInbox.hops))


def sample(pid: int, seconds: float, gil: bool) -> subprocess.Popen[str] | None:
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
    if spy is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".txt", delete=False) as raw:
        pass
    args = [spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "500"]
    args += ["--format", "raw", "--nonblocking", "--output", raw.name]
    if gil:
        args.append("--gil")
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    proc.output = raw.name  # type: ignore[attr-defined]
    return proc


def part_of(frame: str) -> str | None:
    """'redis-py' or 'library' for a frame of py-spy's raw output
    (``name (path:line)``), else None."""
    path = "/" + frame[frame.rfind("(") + 1 :]
    if "/redis/" in path:
        return "redis-py"
    if "/allocator/" in path:
        return "library"
    return None


def split(path: str) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Samples per part (redis-py, library, other) by the innermost frame
    that is in either, and per innermost frame."""
    parts: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    with open(path, encoding="utf-8") as raw:
        for line in raw:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            frames = stack.split(";")
            part = next(filter(None, map(part_of, reversed(frames))), "other")
            parts[part] += int(count)
            leaves[frames[-1]] += int(count)
    return parts, leaves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--resources", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--top", type=int, default=8, help="innermost frames to list")
    parser.add_argument(
        "--cprofile", action="store_true", help="run one more worker under cProfile"
    )
    args = parser.parse_args()
    ctx = multiprocessing.get_context("fork")
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        name = f"profile-{uuid.uuid4().hex[:8]}"
        FairAllocator(client, name).extend([f"r{i}" for i in range(args.resources)])
        start, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(target=worker, args=(server.url, name, start, stop, out))
            for _ in range(args.procs)
        ]
        if args.cprofile:
            procs.append(
                ctx.Process(target=worker, args=(server.url, name, start, stop, out, True))
            )
        for proc in procs:
            proc.start()
        time.sleep(0.5)
        start.set()
        time.sleep(0.5)  # warm
        assert procs[0].pid is not None
        spies = [sample(procs[0].pid, args.seconds, gil) for gil in (False, True)]
        time.sleep(args.seconds)
        stop.set()
        results = [out.get(timeout=60) for _ in procs]
        for proc in procs:
            proc.join(30)
        for spy in spies:
            if spy is not None:
                spy.wait(30)
    grants = sum(r[1] for r in results)
    cpu = sum(r[2] for r in results)
    print(f"allocator from {os.path.dirname(allocator.__file__)}")
    print(
        f"{args.procs} processes, {args.resources} resources, hold 1 ms: {grants} grants "
        f"in about {args.seconds + 0.5:.1f} s; worker CPU per grant {cpu / grants * 1e6:.0f} us"
    )
    hops = sorted(h for r in results for h in r[3])
    if hops:
        p50, p99 = hops[len(hops) // 2], hops[min(len(hops) - 1, len(hops) * 99 // 100)]
        print(
            f"inbox hand-overs (put in one thread, got in another or the same): "
            f"{len(hops) / grants:.2f} per grant, p50 {p50 / 1e3:.0f} us, p99 {p99 / 1e3:.0f} us"
        )
    worker0 = next(r for r in results if r[0] == procs[0].pid)
    print(f"worker 0: {worker0[1]} grants, CPU per grant {worker0[2] / worker0[1] * 1e6:.0f} us")
    if spies[0] is None:
        print("py-spy not found: no split")
        return
    for spy, what in zip(spies, ("on CPU", "holding the GIL"), strict=True):
        assert spy is not None
        parts, leaves = split(spy.output)  # type: ignore[attr-defined]
        total = sum(parts.values()) or 1
        per_grant = worker0[2] / worker0[1] * 1e6
        shares = ", ".join(
            f"{part} {parts[part] / total * 100:.0f} %" for part in ("redis-py", "library", "other")
        )
        print(f"worker 0, {what}: {sum(parts.values())} samples; {shares}")
        if what == "on CPU":
            print(
                "  as us per grant of its CPU: "
                + ", ".join(
                    f"{part} {parts[part] / total * per_grant:.0f}"
                    for part in ("redis-py", "library", "other")
                )
            )
        for leaf, count in leaves.most_common(args.top):
            print(f"  {count / total * 100:4.1f} %  {leaf}")
        if os.environ.get("KEEP_RAW"):
            print("  raw samples:", spy.output)  # type: ignore[attr-defined]
        else:
            os.unlink(spy.output)  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
