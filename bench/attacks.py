"""A second driver attacks a running cluster that runs an honest training job (issue #38; prints figures, not a test).

Starts a one-node local cluster (two simulated H100s) with ``orchestrator up``'s own code in a state directory of
its own. The **honest** side (this process, its own user key, not the administrator) submits a training job
(``jobs/train.py``, checkpointing when asked) and holds a lease of its own, activated. Then the **attacker** -- a
second driver, a process of its own with a user key of its own and neither the administrator's nor an agent's key
(it can reach the cluster: it has Ray's token, as every driver of the cluster has) -- plays every attack of the
issue, each with the outcome it must get, and ``--fuzz`` random calls (random method, arguments from a pool that
names the honest lease and job, random credentials). Where this process runs as root, a **second local user**
(``nobody``) tries to read the state folder and reach the cluster too.

Printed (``--json``: one object): ``attacks`` (named attacks played), ``refused`` (those refused as they must be),
``not_refused`` (their names), ``fuzzed_calls`` with ``fuzz_untyped`` (answers that were not the head's typed
envelope), ``head_alive`` (the same head process answers afterwards: same pid, same start time),
``honest_job_disturbed`` (the honest job was preempted, cancelled, lost or failed, or its lease's holder changed),
``honest_lease_disturbed``, ``cards_used_twice`` (samples in which a card had two holders,
``orchestrator.bench.native.CardChecker``) and ``tokens_leaked`` (honest fencing tokens found anywhere in what
the attacker received). Targets: all refused, head alive, 0 disturbed, 0 used twice, 0 leaked.

    .venv/bin/python bench/attacks.py --json

Outside what the head can defend: Ray has no per-driver permissions, so a driver with the cluster's token can
``ray.kill`` any named actor, the head included (docs/security.md says what restores it and what that costs).
That is not played here.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

NODE = "h100-0"
NAMESPACE = "rgo"


# ---- the attacker (a process of its own) -------------------------------------------------------------------

class Attacker:
    """Plays the attacks through the head's actor (and its channel, and the agent's actor); records every answer."""

    def __init__(self, honest: dict[str, Any]) -> None:
        import ray

        from orchestrator.rayport.ray_api import get_head

        self.ray = ray
        self.honest = honest
        self.head = get_head(NAMESPACE, "rgo-head")
        self.results: list[dict[str, Any]] = []
        self.seen: list[str] = []  # everything received, to look for tokens in
        self.me = {"user": "attacker-" + os.urandom(8).hex()}

    def call(self, method: str, *args: Any, creds: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        """One raw actor call (as any driver can make it); its envelope, or ``{"untyped": ...}``."""
        kwargs["_caller"] = self.me if creds is None else creds
        try:
            reply = self.ray.get(getattr(self.head, method).remote(*args, **kwargs), timeout=60)
        except Exception as e:  # noqa: BLE001 -- an exception across the boundary is a finding, recorded
            reply = {"untyped": f"{type(e).__name__}: {e}"[:500]}
        self.seen.append(json.dumps(reply, default=str))
        return reply if isinstance(reply, dict) else {"ok": reply}

    def expect(self, name: str, refused: bool, detail: Any = "") -> None:
        self.results.append({"attack": name, "refused": bool(refused), "detail": str(detail)[:300]})

    @staticmethod
    def refused(reply: dict[str, Any], *types: str) -> bool:
        return "error" in reply and (not types or reply["error"].get("type") in types)

    # -- the attacks -------------------------------------------------------------------------------------
    def run(self, fuzz: int, seed: int) -> dict[str, Any]:
        h = self.honest
        lid, jid, jlease = h["lease_id"], h["job_id"], h["job_lease_id"]
        # 1. steal a lease: release it with guessed tokens, without the key and with a guessed key
        for guess in (0, 1, 2**32, 2**40 + 7):
            for key in (None, "guessed-key"):
                r = self.call("release", lid, guess, "stolen", key)
                self.expect(f"release honest lease (token {guess}, key {key})", self.refused(r), r)
        r = self.call("release", lid, None, "withdrawn", None)
        self.expect("withdraw honest lease without a token or key", self.refused(r), r)
        for name, args in (("activate", (lid, 1, "evil-holder", None, None)),
                           ("ack_preemption", (lid, 1, "/evil", None))):
            r = self.call(name, *args)
            self.expect(f"{name} on the honest lease", self.refused(r), r)
        # 2. read the honest tokens from any view
        for name, args in (("get_lease", (lid,)), ("get_lease", (lid, "guessed-key")), ("explain_lease", (lid,)),
                           ("status", ()), ("list_jobs", ()), ("job_board", ()), ("get_job", (jid,)),
                           ("explain_job", (jid,)), ("metric_samples", ()), ("agent_inventories", ()),
                           ("wait_lease", (lid, 0.1)), ("job_preemption_requested", (jid,))):
            self.call(name, *args)
        # 3. the honest job: cancel it, read its logs, acknowledge a checkpoint for it, take its id
        r = self.call("cancel_job", jid)
        self.expect("cancel the honest job", self.refused(r, "PermissionDeniedError"), r)
        r = self.call("job_logs", jid)
        self.expect("read the honest job's logs", self.refused(r, "PermissionDeniedError"), r)
        for token in (None, 0, 1, 2**33):
            r = self.call("job_ack_checkpoint", jid, "/evil/ck", 1, token)
            self.expect(f"acknowledge a checkpoint for the honest job (token {token})", self.refused(r), r)
        r = self.call("submit_job", {"name": "evil", "entrypoint": "python -c pass",
                                     "gpu": {"kind": "whole", "count": 1}}, jid)
        self.expect("resubmit under the honest job's id", self.refused(r), r)
        r = self.call("get_job", "../../api/jobs/")
        self.expect("a job id that walks Ray's job API's URLs", self.refused(r, "InvalidRequestError"), r)
        # 4. be an agent: register, heartbeat (acting on the honest leases), inventory -- no key, a forged key
        for creds in (self.me, {**self.me, "agent": "forged", "node": NODE}):
            r = self.call("register_agent", NODE, "fake-node-id", "evil-incarnation",
                          {"name": NODE, "gpus": []}, creds=creds)
            self.expect(f"register as the agent of {NODE} ({'forged key' if 'agent' in creds else 'no key'})",
                        self.refused(r, "PermissionDeniedError"), r)
            r = self.call("heartbeat", NODE, "evil-incarnation", [], {lid: "stolen", jlease: "stolen"},
                          None, None, [], {jlease: "/evil"}, creds=creds)
            self.expect("heartbeat that rejects the honest leases", self.refused(r, "PermissionDeniedError"), r)
            r = self.call("update_inventory", NODE, "evil-incarnation", {"name": NODE, "gpus": []}, creds=creds)
            self.expect("report an empty inventory for the node", self.refused(r, "PermissionDeniedError"), r)
        # 5. the administrator's methods
        for name, args in (("repartition_mig", ("training", False)), ("set_day_clock", ({"speedup": 720},)),
                           ("announce_dashboard", ("http://10.0.0.9:8090/",)),
                           ("announce_dashboard", ("https://evil.example.com/",)),
                           ("report_inventory_check", ({"nodes": [], "disagreements": []},))):
            r = self.call(name, *args)
            self.expect(f"{name}{args[:1]}", self.refused(r), r)
            r = self.call(name, *args, creds={**self.me, "admin": "guessed-admin-key"})
            self.expect(f"{name} with a guessed administrator key", self.refused(r), r)
        # 6. kill the head, Ray's own processes or the honest job through a lease of one's own: name it the workload,
        #    get it preempted (by a request of one's own that fits only in its place)
        mine, my_key = "attacker-own", "attacker-own-key"
        from orchestrator.core.lease import key_digest

        self.call("request_lease", {"lease_id": mine, "request": "timeslice:0.5", "priority_class": "batch",
                                    "requester_digest": key_digest(my_key)})
        got = self.call("wait_lease", mine, 60.0, my_key).get("ok") or {}
        token = got.get("fencing_token")
        self.expect("(setup) the attacker's own lease granted", token is not None, got.get("state"))
        for workload in ("actor:rgo/rgo-head", f"actor:rgo/rgo-agent-{NODE}", "actor:serve/SERVE_CONTROLLER_ACTOR",
                         "actor:_ray_internal/x"):
            r = self.call("activate", mine, token or 0, None, workload, my_key)
            self.expect(f"activate one's own lease with {workload} as its workload",
                        self.refused(r, "InvalidRequestError"), r)
        gcs = _pid_of("gcs_server")
        for workload in (f"job:{h['ray_submission_id']}", f"pid:{gcs or 1}"):
            # Names it may give (a job, a process); the agent must stop neither: they do not hold its lease.
            r = self.call("activate", mine, token or 0, None, workload, my_key)
            self.seen.append(json.dumps(r, default=str))
        self.call("request_lease", {"lease_id": "attacker-preemptor", "request": "timeslice:0.5",
                                    "priority_class": "inference", "requester_digest": key_digest(my_key)})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            st = (self.call("get_lease", mine).get("ok") or {}).get("state")
            if st in ("preempted", "released", "expired", "lost"):
                break
            time.sleep(0.5)
        self.expect("(setup) the attacker's own lease preempted", st == "preempted", st)
        from orchestrator.rayport.agent import process_alive

        alive = gcs is None or process_alive(gcs)
        self.expect("have the agent stop the GCS (a pid workload) through a preemption of one's own lease",
                    alive, f"gcs pid {gcs} alive: {alive}")
        job = (self.call("get_job", h["job_id"]).get("ok") or {}).get("state")
        self.expect("have the agent stop the honest job through a preemption of one's own lease",
                    job == "running", job)
        self.call("release", "attacker-preemptor", None, "done", my_key)
        # 7. the agent's own actor: lend/give back the honest lease, inject a GPU failure
        agent = self.ray.get_actor(f"rgo-agent-{NODE}", namespace=NAMESPACE)
        for name, args in (("lend", (lid, 1)), ("give_back", (lid, 1)), ("adopt", (lid, 1, "00" * 18)),
                           ("inject_health", (0, False, "evil XID")), ("inject_health", (0, False, "evil", "guess"))):
            try:
                out = self.ray.get(getattr(agent, name).remote(*args), timeout=30)
                refused = out is False or (isinstance(out, dict) and "error" in out)
            except Exception as e:  # noqa: BLE001
                out, refused = f"{type(e).__name__}: {str(e)[:200]}", True
            self.expect(f"agent.{name}{args[:1]}", refused, out)
        # 8. the journal in the GCS KV: any driver can read it (our storage: it must hold no token)
        self._journal()
        # 9. the head's channel: a wrong token, an oversized hello
        self._channel()
        # 10. fuzz
        fuzzed, untyped = self._fuzz(fuzz, seed)
        refused_n = sum(1 for r in self.results if r["refused"])
        return {"attacks": len(self.results), "refused": refused_n,
                "not_refused": [r for r in self.results if not r["refused"]],
                "fuzzed_calls": fuzzed, "fuzz_untyped": untyped, "seen": self.seen}

    def _journal(self) -> None:
        from ray.experimental import internal_kv

        from orchestrator.rayport.store import kv_namespace

        ns = kv_namespace(NAMESPACE)
        got = 0
        for key in internal_kv._internal_kv_list("", namespace=ns):
            value = internal_kv._internal_kv_get(key, namespace=ns)
            if value is not None:
                self.seen.append(value.decode(errors="replace"))
                got += 1
        self.seen.append(f"{got} journal records read")

    def _channel(self) -> None:
        from orchestrator.rayport.channel import Channel, ChannelBroken, Endpoint

        got = self.ray.get(self.head.direct_endpoint.remote(), timeout=30).get("ok")
        if not got:
            self.expect("channel: none to attack (direct calls off)", True)
            return
        ep = Endpoint.from_json(got)
        for name, token in (("a wrong token", "wrong-" + "x" * 30), ("an oversized hello", "y" * 64 * 1024)):
            try:
                Channel(Endpoint(ep.host, ep.port, token, ep.cert_pem), 5).call(
                    [["release", [self.honest["lease_id"], 1], {}]], 5)
                ok = False
            except (ChannelBroken, OSError, TimeoutError, Exception) as e:  # noqa: BLE001
                ok = "UNAUTHENTICATED" in str(e) or "RESOURCE_EXHAUSTED" in str(e) or isinstance(e, ChannelBroken)
            self.expect(f"channel call with {name}", ok)

    def _fuzz(self, n: int, seed: int) -> tuple[int, int]:
        from orchestrator.core.api import HEAD_METHODS

        rng = random.Random(seed)
        h = self.honest
        pool: list[Any] = [h["lease_id"], h["job_id"], h["job_lease_id"], NODE, None, 0, 1, -1, 2**63, 2**64, 1e308,
                           float("nan"), "", "x" * 5000, "../../etc/passwd", [], {}, {"name": NODE}, [h["lease_id"]],
                           {h["lease_id"]: "x"}, {"lease_id": "fz", "request": "1"}, True, "actor:rgo/rgo-head",
                           "pid:1", {"speedup": 1e9}, "training", "inference"]
        creds_pool: list[Any] = [self.me, None, {"admin": "guess"}, {"agent": "guess", "node": NODE},
                                 {"user": "x" * 300}, {"evil": 1}, "not-a-mapping"]
        untyped = 0
        methods = [m for m in HEAD_METHODS if m not in ("wait_lease", "acquire_lease")]  # no waits: quick
        for _ in range(n):
            m = rng.choice(methods)
            args = [rng.choice(pool) for _ in range(rng.randint(0, 5))]
            reply = self.call(m, *args, creds=rng.choice(creds_pool))
            if "untyped" in reply or not ("ok" in reply or "error" in reply):
                untyped += 1
                if untyped <= 5:
                    print(f"untyped answer to {m}{tuple(args)!r:.200}: {str(reply)[:300]}", file=sys.stderr)
        return n, untyped


def _pid_of(name: str) -> int | None:
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == name[:15]:
                    return int(d.name)
            except OSError:
                continue
    return None


def attacker_main(address: str, honest_path: str, out_path: str, fuzz: int, seed: int) -> int:
    from orchestrator.rayport import ray_api

    honest = json.loads(Path(honest_path).read_text())
    ray_api.connect(address, NAMESPACE)
    try:
        out = Attacker(honest).run(fuzz, seed)
    finally:
        ray_api.disconnect()
    Path(out_path).write_text(json.dumps(out))
    return 0


# ---- the honest side and the verdict -------------------------------------------------------------------

def _config() -> Any:
    from orchestrator.core.config import DEMO_CONFIG, load_config

    cfg = load_config(DEMO_CONFIG)
    return cfg.model_copy(update={"nodes": (cfg.node(NODE),)})  # two H100s joined by NVLink


def run(state: Any, state_dir: Path, fuzz: int, seed: int, say: Callable[[str], None]) -> dict[str, Any]:
    from orchestrator.bench.native import CardChecker
    from orchestrator.core import credentials as C
    from orchestrator.core.datafiles import job_script
    from orchestrator.core.lease import key_digest
    from orchestrator.rayport import ray_api
    from orchestrator.rayport.client import HeadClient

    ray_api.connect(state.address, state.namespace)
    honest_user = {"user": C.new_key()}
    head = HeadClient(state.namespace, credentials=honest_user)
    checker = CardChecker(head, state.namespace, [NODE]).start()
    ck = Path(tempfile.mkdtemp(prefix="rgo-attacks-ck-"))
    job = head.submit_job({"name": "honest-train", "gpu": {"kind": "whole", "count": 1}, "priority": "training",
                           "checkpoint_dir": str(ck),
                           "entrypoint": f"{sys.executable} {job_script('train.py')} --steps 1500 --seed 3 "
                                         f"--step-delay 0.04 --backend numpy"})
    jid = job["job_id"]
    lkey = C.new_key()
    head.request_lease({"lease_id": "honest-lease", "request": "timeslice:0.5",
                        "priority_class": "inference", "requester_digest": key_digest(lkey)})
    lease = head.wait_lease("honest-lease", 120, lkey)
    lease = {**lease, **head.activate("honest-lease", int(lease["fencing_token"]), None, None, lkey)}
    deadline = time.monotonic() + 180
    while head.get_job(jid)["state"] != "running":
        if time.monotonic() > deadline:
            raise RuntimeError(f"the honest job did not start: {head.get_job(jid)}")
        time.sleep(0.5)
    jlease = head.get_job(jid)["lease_id"]
    say(f"honest job {jid} running on lease {jlease}; honest lease {lease['lease_id']} active")
    before = head.ping()
    honest = {"lease_id": "honest-lease", "job_id": jid, "job_lease_id": jlease,
              "ray_submission_id": head.get_job(jid)["ray_submission_id"]}
    work = Path(tempfile.mkdtemp(prefix="rgo-attacker-"))
    (work / "honest.json").write_text(json.dumps(honest))
    env = {k: v for k, v in os.environ.items() if k not in (C.ADMIN_KEY_ENV, C.USER_KEY_ENV)}
    env.update(state.env)  # Ray's token: every driver of the cluster has it
    env["ORCHESTRATOR_STATE_DIR"] = str(work / "state")  # its own folder: no administrator key in it
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, __file__, "--attacker", state.address, str(work / "honest.json"),
                           str(work / "out.json"), "--fuzz", str(fuzz), "--seed", str(seed)],
                          env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"the attacker failed: {proc.stderr[-3000:]}")
    attack = json.loads((work / "out.json").read_text())
    say(f"attacker: {attack['attacks']} attacks, {attack['fuzzed_calls']} fuzzed calls in "
        f"{time.monotonic() - t0:.0f}s")
    other_user = _other_unix_user(state_dir, state.address)
    # the honest job runs to its end
    deadline = time.monotonic() + 600
    while (j := head.get_job(jid))["state"] not in ("succeeded", "failed", "cancelled"):
        if time.monotonic() > deadline:
            break
        time.sleep(1.0)
    checker.stop()
    after = head.ping()
    now_lease = head.get_lease("honest-lease", lkey)
    job_token = _job_token(head, jid)
    honest_tokens = {str(lease["fencing_token"])} | ({str(job_token)} if job_token else set())
    leaked = sum(1 for t in honest_tokens if any(t in s for s in attack["seen"]))
    disturbed_job = (j["state"] != "succeeded" or j["attempt"] != 1 or bool(j["preemptions"])
                     or any(h["state"] in ("cancelled", "preempting") for h in j["history"]))
    disturbed_lease = not (now_lease["state"] == "active" and now_lease["fencing_token"] == lease["fencing_token"])
    head.release("honest-lease", int(lease["fencing_token"]), "bench over", lkey)
    attacks = attack["attacks"] + other_user["attacks"]
    refused = attack["refused"] + other_user["refused"]
    return {"attacks": attacks, "refused": refused,
            "not_refused": attack["not_refused"] + other_user["not_refused"],
            "fuzzed_calls": attack["fuzzed_calls"], "fuzz_untyped": attack["fuzz_untyped"],
            "head_alive": (after["pid"], after["started_at"]) == (before["pid"], before["started_at"]),
            "honest_job_disturbed": int(disturbed_job), "honest_job_state": j["state"],
            "honest_lease_disturbed": int(disturbed_lease), "cards_used_twice": len(checker.events),
            "tokens_leaked": leaked, "tokens_looked_for": len(honest_tokens),
            "job_token_in_rays_job_table": job_token is not None, "second_unix_user": other_user["note"]}


def _job_token(head: Any, job_id: str) -> int | None:
    """The honest job's token, read where Ray keeps it: the ``env_vars`` of its Ray job's runtime env, which Ray's
    job table shows to every driver of the cluster (Ray has no per-job permissions; docs/security.md)."""
    from orchestrator.core import env as E
    from orchestrator.rayport import ray_api

    sid = head.get_job(job_id).get("ray_submission_id")
    try:
        info = ray_api.RayJobRunner().client.get_job_info(sid)
        return int((info.runtime_env or {}).get("env_vars", {}).get(E.FENCING_TOKEN))
    except Exception:  # noqa: BLE001
        return None


def _other_unix_user(state_dir: Path, address: str) -> dict[str, Any]:
    """As root, a second local user (``nobody``) tries to read what the state folder holds (Ray's token, the
    administrator key, the head's token secret, the user key); without Ray's token it cannot reach the cluster at
    all (Ray's token authentication). Not root: not played (said so)."""
    if os.geteuid() != 0:
        return {"attacks": 0, "refused": 0, "not_refused": [], "note": "not played: needs root to become nobody"}
    import pwd

    nobody = pwd.getpwnam("nobody")
    results = []
    for name in ("auth_token", "admin.key", "head.secret", "user.key", "state.json"):
        path = state_dir / name
        r = subprocess.run(["cat", str(path)], capture_output=True, text=True,
                           preexec_fn=lambda: (os.setgid(nobody.pw_gid), os.setuid(nobody.pw_uid)))  # noqa: PLW1509
        results.append({"attack": f"nobody reads {name}", "refused": r.returncode != 0})
    return {"attacks": len(results), "refused": sum(r["refused"] for r in results),
            "not_refused": [r for r in results if not r["refused"]], "note": "played as nobody"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fuzz", type=int, default=1000, help="random calls the attacker makes after its attacks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--attacker", nargs=3, metavar=("ADDRESS", "HONEST_JSON", "OUT_JSON"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.attacker:
        return attacker_main(*a.attacker, fuzz=a.fuzz, seed=a.seed)
    from orchestrator.core.jsonout import stdout_to_stderr
    from orchestrator.deploy.local import down, interrupt_on_stop_signals, up_local

    say = lambda m: print(f"[attacks] {m}", file=sys.stderr)  # noqa: E731
    interrupt_on_stop_signals()
    state_dir = Path(tempfile.mkdtemp(prefix="rgo-attacks-", dir=os.environ.get("TMPDIR") or "/tmp"))
    with stdout_to_stderr():
        try:
            state = up_local(_config(), state_dir, progress=say)
            out = run(state, state_dir, a.fuzz, a.seed, say)
        except BaseException:
            traceback.print_exc()
            raise
        finally:
            from orchestrator.rayport import ray_api

            ray_api.disconnect()
            down(state_dir, progress=say)
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    ok = (out["refused"] == out["attacks"] and out["head_alive"] and not out["honest_job_disturbed"]
          and not out["honest_lease_disturbed"] and out["cards_used_twice"] == 0 and out["tokens_leaked"] == 0
          and out["fuzz_untyped"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
