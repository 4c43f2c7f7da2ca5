"""Agents enforce leases on a real local Ray cluster: a rogue actor is killed before its cards move on,
a cooperative one checkpoints through the agent and comes back, stale tokens are refused, tokens stay private.

One cluster for the module (``ray_cluster``), a head whose training class may be preempted at once and
has a 3 s grace period. Leases are pinned to ``h100-0`` (2 cards), so every preemptor needs the victim's cards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator.core.config import RuntimeSettings
from orchestrator.core.lease import key_digest
from orchestrator.core.request import GpuRequest
from orchestrator.sdk.leases import lease

from tests.integration.heads import running_head, until as _until

pytestmark = pytest.mark.ray

SETTINGS = RuntimeSettings(namespace="rgo-rv", heartbeat_interval_s=0.5, agent_ttl_s=6.0, reconcile_interval_s=0.1)
BOTH_CARDS = GpuRequest(kind="whole", count=2, node="h100-0")
GRACE_S = 3.0
KEY = "it-key"  # this test's requester key for the preemptors' leases


def _rogue() -> type:
    """Holds a lease and ignores the request to checkpoint (its checkpoint never returns). Defined in a
    function so Ray ships the class by value (workers cannot import this test module)."""

    class Rogue:
        def checkpoint(self, directory: str) -> str:
            time.sleep(3600)
            return directory

        def ping(self) -> int:
            return os.getpid()

    return Rogue


def _trainer() -> type:
    """A cooperative holder: writes its state on request; starts from a checkpoint when given one."""

    class Trainer:
        def __init__(self, resume_from: str | None = None) -> None:
            self.step = int(Path(resume_from).read_text()) if resume_from else 0

        def train(self, steps: int) -> int:
            self.step += steps
            return self.step

        def checkpoint(self, directory: str) -> str:
            Path(directory).mkdir(parents=True, exist_ok=True)
            path = Path(directory) / "step.txt"
            path.write_text(str(self.step))
            return str(path)

    return Trainer


@pytest.fixture(scope="module")
def head(ray_cluster: Any) -> Iterator[Any]:
    from orchestrator.rayport.client import HeadClient

    cfg = ray_cluster.config
    training = cfg.scheduler.classes["training"].model_copy(update={"min_runtime_s": 0.0, "grace_period_s": GRACE_S})
    cfg = cfg.model_copy(update={"scheduler": cfg.scheduler.model_copy(
        update={"classes": {**cfg.scheduler.classes, "training": training}})})
    with running_head(SETTINGS, cfg) as handle:
        yield HeadClient(handle=handle)


def _preemptor(head: Any, lease_id: str) -> None:
    head.request_lease({"lease_id": lease_id, "request": BOTH_CARDS.model_dump(mode="json"), "owner": "it",
                        "priority_class": "inference", "requester_digest": key_digest(KEY)})


def test_a_rogue_actor_is_killed_and_its_cards_go_to_the_preemptor_only_after(head: Any, ray_cluster: Any) -> None:
    import ray

    from orchestrator.rayport import ray_api
    from orchestrator.rayport.wire import unwrap

    with lease(BOTH_CARDS, priority="training", head=head, namespace=SETTINGS.namespace, lease_id="rogue") as le:
        rogue = ray.remote(_rogue()).options(**le.actor_options(num_cpus=0)).remote()
        ray.get(rogue.ping.remote(), timeout=120)
        token = le.fencing_token
        agent = ray.get_actor(ray_api.agent_name("h100-0"), namespace=SETTINGS.namespace)
        assert unwrap(ray.get(agent.check_holder.remote("rogue", token))) is None  # the agent knows the holder
        _preemptor(head, "urgent")
        asked = time.monotonic()
        seen: list[tuple[float, bool, str]] = []
        while time.monotonic() - asked < 60:
            alive = ray_api.named_actor_alive(le.actor_name, SETTINGS.namespace)
            state = head.get_lease("urgent")["state"]
            seen.append((time.monotonic() - asked, alive, state))
            assert not (alive and state != "pending"), f"cards handed on while the rogue lives: {seen[-3:]}"
            if state in ("granted", "active"):
                break
            time.sleep(0.05)
        died_at = next(t for t, alive, _ in seen if not alive)
        granted_at = next(t for t, _, s in seen if s != "pending")
        print(f"\nrogue killed {died_at - GRACE_S:.2f}s after its grace deadline; cards granted at {granted_at:.2f}s")
        assert GRACE_S <= died_at and died_at <= granted_at
        victim = head.get_lease("rogue")
        assert victim["state"] == "preempted" and victim["revoking"] is False
        assert "grace period over" in victim["history"][-1]["reason"]
        # The old holder's token is refused by the agent from now on; the preemptor's is not.
        reply = ray.get(agent.check_holder.remote("rogue", token))
        assert reply["error"]["type"] == "StaleFencingTokenError"
        with pytest.raises(Exception, match="RayActorError|died|dead|killed"):
            ray.get(rogue.ping.remote(), timeout=30)
    st = head.status()
    assert all(d["fencing_token"] is None for d in st["leases"])  # a third party sees no token
    head.release("urgent", _owner_token(head, "urgent"), key=KEY)


def _owner_token(head: Any, lease_id: str) -> int:
    return head.get_lease(lease_id, KEY)["fencing_token"]


def test_a_requeued_actor_checkpoints_through_the_agent_and_resumes(head: Any, tmp_path: Path) -> None:
    import ray

    with lease(BOTH_CARDS, priority="training", head=head, namespace=SETTINGS.namespace, lease_id="coop",
               requeue=True, checkpoint_dir=str(tmp_path)) as le:
        trainer = ray.remote(_trainer()).options(**le.actor_options(num_cpus=0)).remote()
        assert ray.get(trainer.train.remote(7), timeout=120) == 7
        _preemptor(head, "urgent-2")
        _until("the preemptor granted", lambda: head.get_lease("urgent-2")["state"] == "granted", 60)
        done = head.get_lease("coop")
        assert done["state"] == "preempted" and done["checkpoint_path"] == str(tmp_path / "coop" / "step.txt")
        assert "through the agent" in done["history"][-1]["reason"]
        head.release("urgent-2", _owner_token(head, "urgent-2"), key=KEY)
        again = le.wait_resumed(60)
        assert again.lease_id == "coop.a2" and again.resume_from == done["checkpoint_path"]
        resumed = ray.remote(_trainer()).options(**again.actor_options(num_cpus=0)).remote(again.resume_from)
        assert ray.get(resumed.train.remote(1), timeout=120) == 8  # no step lost
        again.release()


def test_leases_json_from_another_driver_shows_no_token(head: Any, ray_cluster: Any) -> None:
    with lease(GpuRequest.whole(1), head=head, namespace=SETTINGS.namespace, lease_id="private") as le:
        assert le.fencing_token >= 1
        out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "leases", "--json", "--address",
                              ray_cluster.address, "--ray-namespace", SETTINGS.namespace],
                             capture_output=True, text=True, timeout=120, env=os.environ)
        assert out.returncode == 0, out.stderr
        shown = {d["lease_id"]: d for d in json.loads(out.stdout)}
        assert shown["private"]["fencing_token"] is None
        assert shown["private"]["handout"]["env_vars"]["ORCHESTRATOR_FENCING_TOKEN"] == "<redacted>"


def _train_in_thread(**kw: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """jobs/train.py's ``run_as_actor`` on a thread of this driver; its result (or error) lands in the dict."""
    from orchestrator.scenarios.actors import load_train

    train, out = load_train(), {}

    def run() -> None:
        try:
            out["result"] = train.run_as_actor(log=lambda s: out.setdefault("log", []).append(s), **kw)
        except Exception as e:  # reported by the test
            out["error"] = repr(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _reference_digest(steps: int, seed: int) -> str:
    from orchestrator.scenarios.actors import load_train

    return load_train().run(steps, seed=seed, log=lambda s: None)["digest"]


def _training_stepped(head: Any, lease_id: str) -> bool:
    from orchestrator.core.errors import UnknownObjectError

    try:
        le = head.get_lease(lease_id)
    except UnknownObjectError:  # not requested yet
        return False
    return le["state"] == "active" and le["workload"] is not None


def test_the_example_training_actor_yields_to_inference_and_ends_bit_identical(head: Any, tmp_path: Path) -> None:
    """jobs/train.py --actor: preempted by an inference lease, it checkpoints through the agent, is stopped,
    comes back from its checkpoint, and ends with the weights of an undisturbed run, no step lost."""
    steps, seed = 400, 7
    t, out = _train_in_thread(steps=steps, seed=seed, checkpoint_dir=str(tmp_path), gpu=BOTH_CARDS,
                              step_delay_s=0.02, head=head, namespace=SETTINGS.namespace, lease_id="ex-train")
    _until("the training actor at work", lambda: "error" in out or (
        _training_stepped(head, "ex-train") and any("training on" in s for s in out.get("log", []))), 120)
    time.sleep(1.0)  # some steps done
    _preemptor(head, "urgent-3")
    _until("the preemptor granted", lambda: head.get_lease("urgent-3")["state"] == "granted", 60)
    victim = head.get_lease("ex-train")
    assert victim["state"] == "preempted" and "through the agent" in victim["history"][-1]["reason"]
    meta = json.loads(Path(victim["checkpoint_path"] + ".meta.json").read_text())
    head.release("urgent-3", _owner_token(head, "urgent-3"), key=KEY)
    t.join(timeout=180)
    assert "error" not in out, out.get("error")
    res = out["result"]
    assert [a["lease_id"] for a in res["attempts"]] == ["ex-train", "ex-train.a2"]
    assert res["attempts"][1]["resumed_at"] == meta["step"] > 0  # resumed where it stopped: no step lost
    assert res["step"] == steps and res["digest"] == _reference_digest(steps, seed)


def test_a_training_actor_resumes_on_another_shape_of_share(head: Any, tmp_path: Path) -> None:
    """Whole card first, a MIG slice after its preemption: the checkpoint carries over and the weights still
    match an undisturbed run. The request is one that either shape satisfies (20 GiB, hard isolation)."""
    steps, seed = 300, 11
    blocker = GpuRequest.mig("1g.20gb")  # a100-1's only slice of 20 GiB: while held, only a whole card fits
    head.request_lease({"lease_id": "blocker", "request": blocker.model_dump(mode="json"), "owner": "it",
                        "priority_class": "inference", "requester_digest": key_digest(KEY)})
    _until("the blocker granted", lambda: head.get_lease("blocker")["state"] == "granted", 60)
    unified = GpuRequest(memory_mib=20480, isolation="hard", node="a100-1")
    t, out = _train_in_thread(steps=steps, seed=seed, checkpoint_dir=str(tmp_path), gpu=unified,
                              step_delay_s=0.02, head=head, namespace=SETTINGS.namespace, lease_id="shape")
    _until("the training actor at work", lambda: "error" in out or (
        _training_stepped(head, "shape") and any("training on" in s for s in out.get("log", []))), 120)
    assert head.get_lease("shape")["allocation"]["kind"] == "whole"
    head.release("blocker", _owner_token(head, "blocker"), key=KEY)
    time.sleep(1.0)
    head.request_lease({"lease_id": "urgent-4", "request": GpuRequest.whole(2, node="a100-1").model_dump(mode="json"),
                        "owner": "it", "priority_class": "inference", "requester_digest": key_digest(KEY)})
    _until("the preemptor granted", lambda: head.get_lease("urgent-4")["state"] == "granted", 60)
    t.join(timeout=180)
    head.release("urgent-4", _owner_token(head, "urgent-4"), key=KEY)
    assert "error" not in out, out.get("error")
    res = out["result"]
    assert [(a["lease_id"], a["kind"]) for a in res["attempts"]] == [("shape", "whole"), ("shape.a2", "mig")]
    assert res["attempts"][1]["cuda_visible_devices"].startswith("MIG-") and res["attempts"][1]["resumed_at"] > 0
    assert res["step"] == steps and res["digest"] == _reference_digest(steps, seed)


def test_a_lease_naming_someone_elses_actor_as_its_workload_never_gets_it_stopped(head: Any) -> None:
    """Revocation stops only the holder (#38 item 3): a second driver's lease of its own, activated with another
    user's actor as its workload (an actor not started with the lease's hand-out nor placed in its group), then
    preempted: the agent leaves that actor alone, confirms, and the preemptor gets the cards."""
    import ray

    from orchestrator.rayport import ray_api

    innocent = ray.remote(_rogue()).options(name="innocent", namespace=SETTINGS.namespace, lifetime="detached",
                                            num_cpus=0).remote()
    pid = ray.get(innocent.ping.remote(), timeout=120)
    try:
        head.request_lease({"lease_id": "attacker", "request": BOTH_CARDS.model_dump(mode="json"),
                            "priority_class": "training", "requester_digest": key_digest("attacker-key")})
        token = head.wait_lease("attacker", 60, "attacker-key")["fencing_token"]
        head.activate("attacker", token, None, f"actor:{SETTINGS.namespace}/innocent", "attacker-key")
        _preemptor(head, "urgent-5")
        _until("the preemptor granted", lambda: head.get_lease("urgent-5")["state"] == "granted", 60)
        assert head.get_lease("attacker")["state"] == "preempted"
        assert ray.get(innocent.ping.remote(), timeout=30) == pid  # the same process, never stopped
        assert ray_api.named_actor_alive("innocent", SETTINGS.namespace)
        head.release("urgent-5", _owner_token(head, "urgent-5"), key=KEY)
    finally:
        ray.kill(innocent)
