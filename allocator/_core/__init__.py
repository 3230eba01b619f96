"""The I/O-free core that `FairAllocator` and `AsyncFairAllocator` share.

Everything that decides anything lives here, one module per concern, so a
reader finds a rule by the file's name (imports go down this list only):

- :mod:`.lead`: who carries out a reader's rounds (the leading waiter, the
  followers);
- :mod:`.reader`: the reader's decisions (heartbeats, rounds, routing
  messages to waiters, failures);
- :mod:`.pool`: :class:`~.pool.Pool`, a pool's operations, made of
  :mod:`.leasing` (acquire, renew, release) and :mod:`.admin` (extend,
  status, gc...);
- :mod:`.clients`: who a pool's clients are, as its views show them;
- :mod:`.presence`: a client's presence (its clocks, the presence table,
  the holder's watch);
- :mod:`.base`: a pool's identity and settings, the reading of its leases;
- :mod:`.replicas` and :mod:`.pending`: confirming writes with ``WAIT``;
  the ends still to deliver;
- :mod:`.messages`, :mod:`.keys`, :mod:`.retry`: the signal-list messages,
  the pool's key names, the retry policy and the retries of a call;
- :mod:`.replies`, :mod:`.checks`, :mod:`.liveness`, :mod:`.steps`: reading
  script replies, the argument checks, the clocks of the liveness mark,
  the vocabulary of steps the shells carry out.

An operation is a generator of *steps* (:class:`~.steps.Call`: run this
script; :class:`~.steps.Wait`: wait for a message; :class:`~.steps.Sleep`:
back off). The shells (`_sync.py`, `_async.py`) only carry steps out, with
blocking or awaiting I/O. A transport error raised by a step is thrown back
into the generator, which decides whether to retry; the same goes for
``KeyboardInterrupt`` and task cancellation, which make a waiting acquire
leave the queue before the exception goes on.
"""
