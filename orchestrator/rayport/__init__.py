"""The one Ray port: every call into Ray on the orchestrator's side.

What lives here: the head and agent actors, the thin wrappers over
``ray.get_actor``/``ray.remote`` (:mod:`.ray_api`), the RPC envelope that
carries typed errors across processes (:mod:`.wire`), the head's
channel beside its actor calls (:mod:`.channel`: the grant path's quick calls
over gRPC, found and authorised through the actor),
the ledger store on
Ray's GCS key-value table, Ray-native GPUs (:mod:`.native`: Ray's hooks, over
:mod:`.held_lease`, :mod:`.adopted_groups` and :mod:`.auto_leases`), and the loopback
site package that runs inside every worker.

May import: :mod:`orchestrator.core`, :mod:`orchestrator.control` (which it
wraps) and ``ray``.  Nothing below this layer imports it; the SDK reaches the
head through the client defined here.
"""
