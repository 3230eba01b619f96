"""A strictly FIFO-fair pool of named resources shared through Redis.

>>> pool = FairAllocator(redis.Redis(), "proxies")          # doctest: +SKIP
>>> pool.extend(["http://10.0.0.1:3128", "http://10.0.0.2:3128"])
>>> with pool.lease(timeout=10) as proxy:
...     fetch(url, proxy=proxy.resource, fence=proxy.token)
"""

from ._async import AsyncFairAllocator
from ._core.keys import acl_key_pattern
from ._scripts import load_functions, load_functions_async
from ._sync import FairAllocator
from ._values import (
    ClientInfo,
    GCReport,
    Lease,
    LeaseInfo,
    PoolStats,
    PoolStatus,
    ResourceStatus,
    TenantStatus,
)
from ._version import __version__ as __version__
from .errors import (
    AcquireTimeout,
    AllocatorError,
    CorruptPool,
    LeaseLost,
    NotReplicated,
    SeveralLeases,
    UnknownResource,
)

__all__ = [
    "AcquireTimeout",
    "AllocatorError",
    "AsyncFairAllocator",
    "ClientInfo",
    "CorruptPool",
    "FairAllocator",
    "GCReport",
    "Lease",
    "LeaseInfo",
    "LeaseLost",
    "NotReplicated",
    "PoolStats",
    "PoolStatus",
    "ResourceStatus",
    "SeveralLeases",
    "TenantStatus",
    "UnknownResource",
    "acl_key_pattern",
    "load_functions",
    "load_functions_async",
]
