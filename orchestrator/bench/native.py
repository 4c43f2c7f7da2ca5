"""Ray's own GPU APIs on a cluster the orchestrator manages: the probes, a checker of who holds which card, and
actor start times (``bench/native.py`` prints them; ``tests/integration/test_native.py`` asserts on them).

**The checker** (:class:`CardChecker`) samples, every ``interval_s``, who holds each card, from what the
head and Ray can each verify:

* every Ray task and actor that is running and asked Ray for ``GPU`` (Ray's state API), mapped through its
  placement group to the lease whose group it is (the agents name their groups, and the groups a holder made
  on its lease's capacity: ``AgentActor.info``'s ``holds.groups``), and so to the cards the ledger gave that
  lease; a GPU task or actor in no lease's group holds a card *without a lease*;
* every such process whose environment fixes its cards for life (``CUDA_VISIBLE_DEVICES`` with Ray told not to
  change it, as a lease's hand-out does): those cards must be its lease's;
* the leases the ledger says hold each card (revoking ones included).

An event (``double_use_events``) is a sample in which a card held whole by one lease is held by another lease too
(MPS shares and time-slices of one card are not: the ledger keeps their sum within the card), a process
running on a card its lease does not hold, or a GPU task or actor in no lease's group.
CUDA is absent here: on real GPUs NVML's per-device process list would be the ground truth to add.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator.core import env as E
from orchestrator.rayport import cards

PROBES: tuple[str, ...] = ("plain", "train", "tune", "serve")
PROBE_SCRIPT = "native_probes.py"


def process_env(pid: int) -> dict[str, str]:
    """The environment process ``pid`` started with ({} when it is gone or not ours to read)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


class CardChecker:
    """Samples who holds each card (see the module docstring); ``events`` lists the samples that broke."""

    def __init__(self, head: Any, namespace: str, nodes: list[str], interval_s: float = 0.5) -> None:
        self.head, self.namespace, self.nodes, self.interval_s = head, namespace, nodes, interval_s
        self.samples = 0
        self.holders_seen = 0
        self.events: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="card-checker", daemon=True)

    def start(self) -> "CardChecker":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:  # the head or the GCS busy: skip this sample
                continue

    def sample(self) -> None:
        leases = {le["lease_id"]: le for le in self.head.status()["leases"]}
        live = {lid: le for lid, le in leases.items()
                if le["state"] in ("granted", "active", "checkpointing") or le.get("revoking")}
        cards_of = {lid: tuple((le.get("allocation") or {}).get("gpu_uuids", ())) for lid, le in live.items()}
        whole = {lid for lid, le in live.items() if (le.get("allocation") or {}).get("kind") == "whole"}
        groups = cards.agent_groups(self.namespace, self.nodes)
        users: dict[str, set[str]] = {}
        now = time.time()
        for lid, held in cards_of.items():
            for c in held:
                users.setdefault(c, set()).add(lid)
        for pid, pg, kind in cards.running_gpu_holders():
            self.holders_seen += 1
            lid = groups.get(pg or "")
            if lid is None:
                state = cards.group_state(pg)
                if state in ("REMOVED", None) and pg:
                    continue  # its lease ended and its group went; Ray's task table has yet to say it stopped
                self.events.append({"at": now, "unleased": {"pid": pid, "kind": kind, "placement_group": pg,
                                                            "group_state": state}})
                continue
            if lid not in cards_of:  # granted after this sample read the ledger: read it now
                le = self.head.get_lease(lid)
                cards_of[lid] = tuple((le.get("allocation") or {}).get("gpu_uuids", ()))
            env = process_env(int(pid)) if pid else {}
            # A process that Ray may not narrow (a lease's hand-out said so) keeps the devices it started with;
            # any other has Ray set them per task from its own books, which the group above stands for.
            fixed = env.get(E.RAY_NOSET_CUDA_VISIBLE_DEVICES) == "1"
            seen = [c for c in env.get(E.CUDA_VISIBLE_DEVICES, "").split(",") if c.startswith("GPU-") and fixed]
            stray = [c for c in seen if c not in cards_of.get(lid, ())]
            if stray:  # the process's devices are not its lease's
                self.events.append({"at": now, "card": stray[0], "holder": pid, "lease": lid})
        self.samples += 1
        for c, who in users.items():
            if len(who) > 1 and who & whole:  # a whole card shares with nothing; shares of one card may
                self.events.append({"at": now, "card": c, "leases": sorted(who)})


def read_probe(logs: str, what: str) -> dict[str, Any] | None:
    tag = f"NATIVE_{what.upper().replace('-', '_')}="
    line = next((x for x in logs.splitlines() if x.startswith(tag)), None)
    return json.loads(line[len(tag):]) if line else None


def _one_card_each(seen: list[dict[str, Any]]) -> str | None:
    """None when each holder saw exactly one card that Ray and CUDA agree on; else what was wrong."""
    for s in seen:
        ids, cvd = s.get("gpu_ids") or [], s.get("cuda_visible_devices") or ""
        if len(ids) != 1 or ids[0] not in cvd.split(","):
            return f"saw gpu_ids={ids} CUDA_VISIBLE_DEVICES={cvd!r}"
    return None


def judge(what: str, out: dict[str, Any] | None) -> str:
    """``"ok"`` when probe ``what``'s output shows Ray's API telling the truth inside leases; else the error."""
    if out is None:
        return "no output"
    if what == "plain":
        bad = _one_card_each([*out["whole"], out["half"]])
        return bad or "ok"
    if what == "train":
        if out.get("error"):
            return str(out["error"])
        seen = out["workers"]
        if len(seen) != 2:
            return f"{len(seen)} of 2 workers reported"
        if len({s["gpu_ids"][0] for s in seen if s.get("gpu_ids")}) != 2:
            return f"the two workers did not see two cards: {seen}"
        return _one_card_each(seen) or "ok"
    if what == "tune":
        if out.get("errors"):
            return "; ".join(out["errors"])
        seen = [json.loads(s) for s in out["trials"] if s]
        if len(seen) != 2:
            return f"{len(seen)} of 2 trials reported"
        return _one_card_each(seen) or "ok"
    seen = out["replicas"]
    return _one_card_each(seen) or "ok"


def p50(xs: list[float]) -> float:
    return round(statistics.median(xs), 1) if xs else float("nan")


def probe_entrypoint(python: str, jobs_dir: Path, what: str) -> str:
    return f"{python} {jobs_dir / PROBE_SCRIPT} {what}"


def job_env(namespace: str, extra: dict[str, str] | None = None) -> dict[str, Any]:
    """A plain Ray job's runtime env on our cluster: only the head's namespace (the raylets carry the rest)."""
    return {"env_vars": {E.NAMESPACE: namespace, "TMPDIR": os.environ.get("TMPDIR", "/tmp"), **(extra or {})}}
