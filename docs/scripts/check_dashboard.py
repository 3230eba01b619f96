"""Run every query of docs/grafana-dashboard.json through a real Prometheus.

    python docs/scripts/check_dashboard.py                  # prometheus from PATH
    python docs/scripts/check_dashboard.py --prometheus /opt/prometheus/prometheus

Starts, each private and on free loopback ports: a ``redis-server`` (from
PATH), ``allocator metrics --all`` on it, and a Prometheus scraping that
every second into a temporary directory. Meanwhile a few threads lease,
release, time out and quarantine (by an operator and on release) in two
pools, one of capacity 2, one in the order ``tenant`` with two tenants, so
that every series has something to show. Once
Prometheus holds enough samples for the rate windows, each panel's query
(Grafana's ``$pool`` as its "All" value ``.*``, and as one pool's name;
``$__rate_interval`` and the like as a fixed window) goes to
``/api/v1/query``, and so does the ``pool`` variable's
``label_values(allocator_leases, pool)`` (as ``/api/v1/label/pool/values``).
Each must answer ``success``, with no warning, and at least one series.
Prints one line per query; exit status 0 when all passed, 1 if one did not.

Debian and Ubuntu: ``apt-get install prometheus`` (it runs offline; the
service it installs is not needed and may stay stopped).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import redis

from allocator import AcquireTimeout, FairAllocator
from allocator._server import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
SCRAPE_S = 1
#: What Grafana puts for its interval variables: a window of several scrapes.
WINDOW = "15s"


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expression) for every target of every panel."""
    return [
        (f"{panel['title']} [{target['refId']}]", target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def expand(expr: str, pool: str) -> str:
    expr = expr.replace("$pool", pool)
    return re.sub(r"\$__[a-z_]+", WINDOW, expr)


def api(base: str, path: str, **params: str) -> dict[str, Any]:
    address = f"{base}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(address, timeout=30) as reply:
        return json.loads(reply.read().decode())  # type: ignore[no-any-return]


class Traffic:
    """Threads that keep two pools busy until stopped."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.stop = threading.Event()
        self.proxies = FairAllocator(self.client, "proxies")
        self.proxies.extend([f"http://10.0.0.{i}:3128" for i in range(1, 5)])
        # Two crawlers share the proxies fairly (the tenant panels).
        self.proxies.set_order("tenant")
        self.keys = FairAllocator(self.client, "api-keys")
        self.keys.extend(["key-A", "key-B"], capacity=2)
        self.threads = [
            threading.Thread(target=self._worker, args=(pool, i), daemon=True)
            for i, pool in enumerate([self.proxies] * 4 + [self.keys] * 3)
        ]
        self.threads.append(threading.Thread(target=self._operator, daemon=True))

    def __enter__(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)
        self.client.close()

    def _worker(self, pool: FairAllocator, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            try:
                lease = pool.acquire(
                    timeout=0.3, owner=f"worker-{seed}", tenant=f"crawler-{seed % 2}"
                )
            except AcquireTimeout:
                continue
            self.stop.wait(rng.uniform(0.02, 0.2))
            # Now and then a holder finds its resource broken.
            pool.release(lease, quarantine=0.5 if rng.random() < 0.05 else None)

    def _operator(self) -> None:
        rng = random.Random(99)
        while not self.stop.wait(2.0):
            name = rng.choice([r.name for r in self.proxies.status().resources])
            self.proxies.quarantine(name, 1.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--prometheus",
        default=shutil.which("prometheus"),
        help="the prometheus executable (default: from PATH)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=20.0,
        help="seconds of samples before the queries run (20)",
    )
    args = parser.parse_args()
    if not args.prometheus:
        print(
            "check_dashboard: no prometheus on PATH (apt-get install prometheus)", file=sys.stderr
        )
        return 1
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory(prefix="allocator-dashboard-") as tmp:
        with RedisServer() as server, Traffic(server.url):
            exporter_port, prometheus_port = free_port(), free_port()
            exporter = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "allocator",
                    "metrics",
                    "--all",
                    "--port",
                    f"{exporter_port}",
                ],
                env={**os.environ, "REDIS_URL": server.url, "ALLOCATOR_PREFIX": "alloc"},
                stderr=subprocess.PIPE,
                text=True,
            )
            config = Path(tmp) / "prometheus.yml"
            config.write_text(
                f"global:\n  scrape_interval: {SCRAPE_S}s\n  evaluation_interval: {SCRAPE_S}s\n"
                "scrape_configs:\n  - job_name: allocator\n    static_configs:\n"
                f"      - targets: ['127.0.0.1:{exporter_port}']\n",
                encoding="utf-8",
            )
            prometheus = subprocess.Popen(
                [
                    args.prometheus,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={Path(tmp) / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prometheus_port}",
                    "--log.level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                assert exporter.stderr is not None
                print(exporter.stderr.readline().strip())
                base = f"http://127.0.0.1:{prometheus_port}"
                return check(base, dashboard, args.warmup)
            finally:
                for proc in (prometheus, exporter):
                    proc.terminate()
                    proc.wait(timeout=30)


def check(base: str, dashboard: dict[str, Any], warmup: float) -> int:
    deadline = time.monotonic() + 60
    while True:
        try:
            up = api(base, "/api/v1/query", query='up{job="allocator"} == 1')
            if up["data"]["result"]:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            print("check_dashboard: Prometheus never scraped the exporter", file=sys.stderr)
            return 1
        time.sleep(0.5)
    print(f"prometheus at {base} scrapes the exporter; {warmup:g} s of samples first")
    time.sleep(warmup)
    failures = 0
    variable = api(base, "/api/v1/label/pool/values", **{"match[]": "allocator_leases"})
    pools = variable.get("data") or []
    ok = variable.get("status") == "success" and {"proxies", "api-keys"} <= set(pools)
    failures += not ok
    print(
        f"{'ok  ' if ok else 'FAIL'} variable pool: label_values(allocator_leases, pool) -> {pools}"
    )
    for title, expr in queries(dashboard):
        for pool in (".*", "proxies"):
            query = expand(expr, pool)
            reply = api(base, "/api/v1/query", query=query)
            result = reply.get("data", {}).get("result", [])
            ok = reply.get("status") == "success" and not reply.get("warnings") and bool(result)
            failures += not ok
            shown = ", ".join(
                f"{_labels(r['metric'])}={float(r['value'][1]):.3g}" for r in result[:3]
            ) + (f" (+{len(result) - 3})" if len(result) > 3 else "")
            print(
                f"{'ok  ' if ok else 'FAIL'} {title} ($pool={pool}): {len(result)} series: {shown}"
            )
            if not ok:
                print(f"     {query}\n     {json.dumps(reply)[:500]}")
    total = 1 + 2 * len(queries(dashboard))
    print(f"{total - failures} of {total} queries returned data")
    return 1 if failures else 0


def _labels(metric: dict[str, str]) -> str:
    return "{" + ",".join(f"{k}={v}" for k, v in sorted(metric.items()) if k != "__name__") + "}"


if __name__ == "__main__":
    sys.exit(main())
