"""Revocation: the head decides that a lease's devices come back; the node's agent carries it out.

Nomenclature: a **workload** is what runs on a lease's devices, named so the
agent can stop it: ``actor:<namespace>/<name>`` (a named Ray actor, stopped
with ``ray.kill``), ``job:<submission id>`` (a Ray job, stopped through the
job API) or ``pid:<n>`` (a process on the node). The holder that activates a
lease names it (``activate(..., workload=)``); the job layer names its Ray
jobs.

Rules (the controller applies them; this module states them once):

* **Fenced until confirmed.** A lease preempted while something may run on it
  (ACTIVE or CHECKPOINTING -> PREEMPTED) on a node whose agent is registered
  is *revoking*: it has ended, but its devices stay taken -- in the snapshot,
  and for the scheduler, whose request it was preempted for stays nominated --
  until the agent reports them free (``revoked`` in its heartbeat) or the node
  is declared lost. A device is never handed to the next holder while the old
  one may still run on it.
  A Ray job that acknowledged its checkpoint is the exception: it exits by
  itself and the job layer stops it, so its devices are freed at once.
* **The agent stops the holder.** The heartbeat reply lists the node's
  revoking leases with their token, workload and reason
  (:func:`node_revocations`); the agent stops the workload, then confirms, and
  from then on refuses that token.
* **The agent asks for the checkpoint.** A checkpointing lease's assignment
  carries its workload and checkpoint directory (:func:`node_assignments`): the
  agent calls a preemptible actor's ``checkpoint(dir) -> path`` and reports the
  path (``checkpointed``), which acknowledges the preemption. An actor that
  never answers is stopped at its grace deadline like any other.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable

from orchestrator.control.ledger import Ledger, LedgerEntry
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.lease import LeaseState

WORKLOAD_KINDS = ("actor", "job", "pid")


def parse_workload(workload: str) -> tuple[str, str]:
    """``"actor:rgo/name"`` -> ``("actor", "rgo/name")``; a malformed one raises naming the field."""
    kind, sep, ref = workload.partition(":")
    if not sep or kind not in WORKLOAD_KINDS or not ref or (kind == "pid" and not ref.isdigit()) or (
            kind == "actor" and "/" not in ref):
        raise InvalidRequestError("workload", workload, ["actor:<namespace>/<name>", "job:<submission id>", "pid:<n>"])
    return kind, ref


#: The name of node N's agent actor is this prefix and N (in the orchestrator's Ray namespace).
AGENT_ACTOR_PREFIX = "rgo-agent-"
#: Ray's own named actors that a revocation never stops, by namespace and name prefix: Serve's controller and
#: its proxies (``SERVE_PROXY_ACTOR-<node>``). Serve's replicas (``SERVE_REPLICA::...``) are holders like any other.
_RAY_SYSTEM = {"serve": ("SERVE_CONTROLLER_ACTOR", "SERVE_PROXY_ACTOR")}


def protected_workload(workload: str, *, namespace: str, head_name: str) -> str | None:
    """Why a revocation may never stop ``workload`` (None: it may): the orchestrator's head or one of its
    agents, or one of Ray's own system actors (any namespace Ray keeps to itself, ``_ray...``; Serve's
    controller and proxies). A lease's holder names its workload itself, so the head refuses these at
    ``activate`` and the agent checks again before it stops anything (``docs/security.md``)."""
    kind, ref = parse_workload(workload)
    if kind != "actor":
        return None
    ns, name = ref.split("/", 1)
    if ns == namespace and (name == head_name or name.startswith(AGENT_ACTOR_PREFIX)):
        return f"actor {name} in namespace {ns} is the orchestrator's own"
    if ns.startswith("_ray") or name.startswith(_RAY_SYSTEM.get(ns, ())):
        return f"actor {name} in namespace {ns} is one of Ray's own"
    return None


def actor_workload(namespace: str, name: str) -> str:
    return f"actor:{namespace}/{name}"


def must_confirm(before: LedgerEntry, agent_registered: bool, *, checkpointed: bool = False) -> bool:
    """Whether a lease ending from ``before`` with its workload possibly still running (PREEMPTED, or RELEASED by a
    cancel) keeps its devices until the agent confirms.

    A Ray job that acknowledged its checkpoint (``checkpointed``) is not fenced: it exits by itself and
    the job layer stops it. A victim past its grace, or an actor (which only the agent stops), is."""
    if checkpointed and before.workload and parse_workload(before.workload)[0] == "job":
        return False
    return agent_registered and before.lease.state in (LeaseState.ACTIVE, LeaseState.CHECKPOINTING)


def on_node(entries: Iterable[LedgerEntry], node: str) -> list[LedgerEntry]:
    return [e for e in entries if e.lease.allocation is not None and e.lease.allocation.node_name == node]


def revoking_on(ledger: Ledger, node: str) -> list[LedgerEntry]:
    return [e for e in ledger.occupying_on(node) if e.revoking]


def confirmed(e: LedgerEntry) -> LedgerEntry:
    return replace(e, revoking=False)


def confirm(ledger: Ledger, node: str, lease_ids: Iterable[str] | None = None) -> list[LedgerEntry]:
    """Mark the node's revoking leases in ``lease_ids`` (all of them: None) confirmed free; returns them
    as they were, for the caller to give their devices back."""
    ids = None if lease_ids is None else set(lease_ids)
    done = [e for e in revoking_on(ledger, node) if ids is None or e.lease_id in ids]
    ledger.commit([confirmed(e) for e in done])
    return done


def node_assignments(ledger: Ledger, node: str) -> dict[str, Any]:
    """The desired set of one node: every holding lease with what the agent needs to hold it."""
    out = {}
    for e in ledger.occupying_on(node):
        if not e.lease.holding:
            continue
        a = e.lease.allocation
        assert a is not None
        out[e.lease_id] = {"allocation": a.to_json(), "fencing_token": e.lease.fencing_token,
                           "env": e.handout.env_vars if e.handout else None, "state": e.lease.state.value,
                           "workload": e.workload, "checkpoint_dir": e.spec.checkpoint_dir}
    return out


def node_revocations(ledger: Ledger, node: str) -> dict[str, Any]:
    """What the node's agent must stop and confirm: its revoking leases."""
    return {e.lease_id: {"fencing_token": e.lease.fencing_token, "workload": e.workload, "reason": e.reason()}
            for e in revoking_on(ledger, node)}


def agent_work(ledger: Ledger) -> dict[str, set[tuple[str, str]]]:
    """Per node, what its agent must act on now: actors to ask for a checkpoint, leases to revoke and new grants
    to hold, as ``(lease id, "checkpoint" | "revoke" | "hold")``. The head wakes an agent when its set gains an item, so the agent
    need not wait out its heartbeat interval to learn of it (the heartbeat stays the backstop)."""
    out: dict[str, set[tuple[str, str]]] = {}
    for e in ledger.occupying_any_order():  # a revoking or checkpointing lease occupies its devices
        a = e.lease.allocation
        if a is None:
            continue
        if e.revoking:
            out.setdefault(a.node_name, set()).add((e.lease_id, "revoke"))
        elif e.lease.state is LeaseState.CHECKPOINTING and (e.workload or "").startswith("actor:"):
            out.setdefault(a.node_name, set()).add((e.lease_id, "checkpoint"))
        elif e.lease.state is LeaseState.GRANTED:
            # a new grant: the agent makes its placement group (control/holds.py), which its holder waits for
            out.setdefault(a.node_name, set()).add((e.lease_id, "hold"))
    return out

