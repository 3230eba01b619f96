"""The I/O-free core that `FairAllocator` and `AsyncFairAllocator` share.

Everything that decides anything lives here, one module per concern, so a
reader finds a rule by the file's name (imports go down this list only):

- :mod:`.reader`: the reader's decisions (heartbeats, rounds, routing grants
  to waiters, failures);
- :mod:`.pool`: :class:`~.pool.Pool`, a pool's operations, made of
  :mod:`.leasing` (acquire, renew, release) and :mod:`.admin` (extend,
  status, gc...) on :mod:`.base` (identity, keys, replies, retries);
- :mod:`.replicas`: confirming writes with ``WAIT``;
- :mod:`.replies`, :mod:`.keys`, :mod:`.checks`: reading script replies,
  the pool's key names, the argument checks;
- :mod:`.retry` and :mod:`.liveness`: the retry policy and the clocks of
  liveness;
- :mod:`.steps`: the vocabulary of steps the shells carry out.

An operation is a generator of *steps* (:class:`~.steps.Call`: run this
script; :class:`~.steps.Wait`: wait for a message; :class:`~.steps.Sleep`:
back off). The shells (`_sync.py`, `_async.py`) only carry steps out, with
blocking or awaiting I/O. A transport error raised by a step is thrown back
into the generator, which decides whether to retry; the same goes for
``KeyboardInterrupt`` and task cancellation, which make a waiting acquire
leave the queue before the exception goes on.
"""
