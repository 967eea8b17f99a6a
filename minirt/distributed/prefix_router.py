"""`minirt serve --replicas N --routing prefix`: send a prompt to the replica that served its
prefix last, so that its prefix cache already holds it.

Owns: `PrefixAffinityRouter`, a Ray Serve request router (its `RequestRouter` interface, set as
the replicas' `request_router_class`; Ray Serve runs it in the process that holds the handle: the
ingress).  It reads each order's block keys (minirt/engine/prefix_cache.py `prompt_block_keys`:
key i stands for the prompt's first i + 1 blocks of 16 tokens, as the prefix cache finds them),
and remembers, for each key, the replica an order with it went to last.

    choose_replicas   the replica that last served the longest of the prompt's prefixes, when
                      it is not much busier than the least busy replica; else (or with no
                      prefix known) power of two choices, as Ray Serve's default router
    on_request_routed every key of the order now points at the replica it went to
    on_request_completed / on_replica_actor_died   the router's counts of requests in flight

"Much busier": more than `imbalance` requests in flight beyond the least busy replica (the
command passes --batch-size).  Under continuous batching a replica runs that many rows at once,
so a request routed to a replica with a full batch's worth more in flight queues behind about one
whole request's life (tens of rounds), while the cached prefix saves at most its prefill, about
one round.  Within that margin the cache wins; past it, the queue costs more than the cache gives.
The counts are the router's own (one ingress sends every request, so it knows each in flight
exactly), not probes.

The table of keys is bounded (MAX_KEYS, least recently routed first out); a key whose replica
is gone is forgotten.  With several ingresses each would keep its own table (Ray's own prefix
router shares one through an actor); `minirt serve` has one.

Must not know: HTTP, the engine, or what a replica computes.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

# Keys remembered: each 16 tokens of some prompt's prefix; 1M keys cover 16M prompt tokens.
MAX_KEYS = 1_000_000
# Requests told completed before routed, remembered (oldest out past this many): Ray Serve fires
# its completion callback as soon as a stream ends, which for an order refused at once can be
# before it tells the router where the order went; a rejected try is told completed only.
MAX_COMPLETED_EARLY = 10_000


def order_keys(pending_request: PendingRequest | None) -> tuple[int, ...]:
    """The block keys of an order's first prompt (none for any other call)."""
    if pending_request is None or not pending_request.args:
        return ()
    return tuple(getattr(pending_request.args[0], "prefix_keys", ()))


class PrefixAffinityRouter(RequestRouter):
    """Prefix affinity within a load margin, else power of two choices."""

    def initialize_state(self, imbalance: int = 8, **_unused: Any) -> None:
        self.imbalance = imbalance
        self.last_replica: OrderedDict[int, ReplicaID] = OrderedDict()
        self.in_flight: dict[ReplicaID, set[str]] = {}
        self.completed_early: OrderedDict[str, None] = OrderedDict()

    def load(self, replica_id: ReplicaID) -> int:
        return len(self.in_flight.get(replica_id, ()))

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """The ranks of replicas to try: the prefix's replica first when it is close enough to
        the least busy; then two random ones (Ray Serve probes a rank and takes the least
        loaded of it that accepts)."""
        if not candidate_replicas:
            return []
        two = random.sample(candidate_replicas, min(2, len(candidate_replicas)))
        affine = self.affine_replica(candidate_replicas, order_keys(pending_request))
        if affine is None:
            return [two]
        return [[affine], two]

    def affine_replica(
        self, candidates: list[RunningReplica], keys: tuple[int, ...]
    ) -> RunningReplica | None:
        """The candidate that served the longest of these prefixes last, unless it has more than
        `imbalance` requests in flight beyond the least busy candidate."""
        by_id = {replica.replica_id: replica for replica in candidates}
        least = min(self.load(replica_id) for replica_id in by_id)
        for key in reversed(keys):
            replica_id = self.last_replica.get(key)
            if replica_id in by_id:
                if self.load(replica_id) - least > self.imbalance:
                    return None
                return by_id[replica_id]
        return None

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result):
        request_id = pending_request.metadata.internal_request_id
        if request_id in self.completed_early:
            # Its stream has ended already: it is in flight nowhere.
            del self.completed_early[request_id]
        else:
            self.in_flight.setdefault(replica_id, set()).add(request_id)
        for key in order_keys(pending_request):
            self.last_replica[key] = replica_id
            self.last_replica.move_to_end(key)
        while len(self.last_replica) > MAX_KEYS:
            self.last_replica.popitem(last=False)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        in_flight = self.in_flight.get(replica_id, set())
        if internal_request_id in in_flight:
            in_flight.discard(internal_request_id)
            return
        self.completed_early[internal_request_id] = None
        while len(self.completed_early) > MAX_COMPLETED_EARLY:
            self.completed_early.popitem(last=False)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.in_flight.pop(replica_id, None)
        gone = [key for key, holder in self.last_replica.items() if holder == replica_id]
        for key in gone:
            del self.last_replica[key]
