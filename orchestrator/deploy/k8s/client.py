"""Apply, watch and delete the rendered objects through the Kubernetes API.

The thin I/O layer of this package: everything it sends comes from
``render.render_objects``; everything it decides (what ready means, what a
missing CRD means) is spelled out here so the CLI only prints.

* **apply** is server-side apply: ``PATCH`` with
  ``Content-Type: application/apply-patch+yaml``, ``fieldManager=ray-gpu-orchestrator``
  and ``force=true`` (we own these objects; a human's ``kubectl edit`` of a
  field we set is overwritten, which is the point of rendering from config).
  Applying the same objects twice changes nothing, so a retry is always safe.
* Discovery (``kubernetes.dynamic``) maps each apiVersion/kind to its REST
  path. A kind the server does not serve means its CRD is not installed:
  fatal for the KubeRay kinds (install the operator first), a skip with the
  reason for :data:`OPTIONAL_KINDS` (a PodMonitor without the Prometheus
  operator).
* **wait** polls the RayCluster until ``status.state == "ready"``; the clock
  and the sleep are injected so tests never sleep.
* **delete** removes objects in reverse apply order; an object already gone
  counts as deleted (idempotent). The Namespace is kept unless asked.
* **generated keys**: a Secret the renderer annotates with
  :data:`GENERATE_KEYS_ANNOTATION` (the GCS Redis password) is rendered without
  data; right after applying it, each listed key it lacks is filled with a
  random value under a field manager of its own (:data:`GENERATED_MANAGER`).
  Our manager never sets those keys, so no later apply removes or overwrites
  them, and a key the operator put there first is kept as it is.

Errors are typed: :class:`~orchestrator.core.errors.NotConnectedError` when the
API server cannot be reached (retryable), :class:`KubernetesApiError` with
the HTTP status and the server's reason otherwise.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from orchestrator.core.extras import require
from orchestrator.core.errors import NotConnectedError, OrchestratorError
from orchestrator.deploy.k8s.render import FIELD_MANAGER, GENERATE_KEYS_ANNOTATION, Obj, object_key

#: The field manager that owns generated Secret keys (never FIELD_MANAGER, whose applies would drop them).
GENERATED_MANAGER = f"{FIELD_MANAGER}-generated"

OPTIONAL_KINDS: frozenset[tuple[str, str]] = frozenset({("monitoring.coreos.com/v1", "PodMonitor")})
READY = "ready"


class KubernetesApiError(OrchestratorError):
    """The API server refused a request. ``status`` is the HTTP status, ``reason`` the server's reason."""

    def __init__(self, verb: str, kind: str, name: str, status: int, reason: str, message: str) -> None:
        self.verb, self.kind, self.name = verb, kind, name
        self.status, self.reason, self.message = status, reason, message
        # Conflicts, throttling and server trouble pass; a 4xx about the object does not.
        self.retryable = status in (409, 429) or status >= 500
        super().__init__(f"{verb} {kind}/{name}: HTTP {status} {reason}: {message}")


class CrdMissingError(OrchestratorError):
    """The server does not serve a kind we must create: its operator (and CRD) is not installed."""

    def __init__(self, api_version: str, kind: str, hint: str) -> None:
        self.api_version, self.kind, self.hint = api_version, kind, hint
        super().__init__(f"the cluster does not serve {api_version} {kind}: {hint}")


class WaitTimeoutError(OrchestratorError, TimeoutError):
    """The RayCluster did not become ready in time; ``last`` is the last status seen. Retryable."""

    retryable = True

    def __init__(self, name: str, timeout_s: float, last: "ClusterStatus") -> None:
        self.name, self.timeout_s, self.last = name, timeout_s, last
        super().__init__(f"RayCluster {name} not ready after {timeout_s:g}s: {last.summary()}")


@dataclass(frozen=True)
class ObjectResult:
    """What happened to one object: ``applied``, ``skipped``, ``generated`` (keys of a Secret), ``deleted``
    or ``kept``, and why."""

    kind: str
    name: str
    namespace: str
    action: str
    reason: str = ""


@dataclass(frozen=True)
class ClusterStatus:
    """A RayCluster's status as KubeRay reports it; ``state`` None means the object does not exist."""

    name: str
    namespace: str
    state: str | None
    reason: str = ""
    ready_workers: int = 0
    desired_workers: int = 0
    head_pod_ip: str = ""
    conditions: tuple[tuple[str, str, str], ...] = field(default=())  # (type, status, reason)

    @property
    def ready(self) -> bool:
        return self.state == READY

    def summary(self) -> str:
        if self.state is None:
            return "not found"
        s = f"state={self.state or 'pending'} workers={self.ready_workers}/{self.desired_workers}"
        if self.reason:
            s += f" reason={self.reason}"
        failing = [f"{t}={st}({r})" for t, st, r in self.conditions if st != "True" and r]
        if failing:
            s += " conditions: " + ", ".join(failing)
        return s

    @classmethod
    def from_object(cls, obj: Obj) -> "ClusterStatus":
        st = obj.get("status") or {}
        conds = tuple(
            (c.get("type", ""), c.get("status", ""), c.get("reason", "")) for c in st.get("conditions") or []
        )
        return cls(
            name=obj["metadata"]["name"],
            namespace=obj["metadata"].get("namespace", ""),
            state=st.get("state", ""),
            reason=st.get("reason", ""),
            ready_workers=int(st.get("readyWorkerReplicas", st.get("availableWorkerReplicas", 0)) or 0),
            desired_workers=int(st.get("desiredWorkerReplicas", 0) or 0),
            head_pod_ip=(st.get("head") or {}).get("podIP", ""),
            conditions=conds,
        )


def _api_error(verb: str, obj_kind: str, name: str, e: Any) -> KubernetesApiError:
    status = int(getattr(e, "status", 0) or 0)
    reason, message = str(getattr(e, "reason", "") or ""), ""
    body = getattr(e, "body", None)
    if body:
        try:
            doc = json.loads(body)
            message, reason = doc.get("message", ""), doc.get("reason", reason)
        except (TypeError, ValueError):
            message = str(body)[:500]
    return KubernetesApiError(verb, obj_kind, name, status, reason, message)


def _kubernetes(module: str) -> Any:
    """A module of the ``kubernetes`` client, an optional dependency: without it, MissingExtraError names the
    ``k8s`` extra (``pip install 'ray-gpu-orchestrator[k8s]'``)."""
    return require(module, "k8s")


class KubeRayClient:
    """Server-side apply, status and delete of our objects over one ``kubernetes`` ApiClient."""

    def __init__(self, api_client: Any, *, discovery_cache: str | None = None) -> None:
        DynamicClient = _kubernetes("kubernetes.dynamic").DynamicClient  # here: render needs no client

        self._api = api_client
        try:
            self._dyn = DynamicClient(api_client, cache_file=discovery_cache)
        except Exception as e:  # noqa: BLE001  (discovery is the first call: any failure means unreachable)
            raise self._unreachable(e) from e

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None = None, context: str | None = None,
                        *, discovery_cache: str | None = None) -> "KubeRayClient":
        """A client from a kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``), else the in-cluster config."""
        k8s_client = _kubernetes("kubernetes.client")
        k8s_config = _kubernetes("kubernetes.config")

        try:
            api = k8s_config.new_client_from_config(config_file=kubeconfig, context=context)
        except (k8s_config.ConfigException, FileNotFoundError, OSError) as e:
            if kubeconfig or context:
                raise NotConnectedError(f"cannot load kubeconfig {kubeconfig or '(default)'}: {e}") from e
            try:
                k8s_config.load_incluster_config()
            except k8s_config.ConfigException as e2:
                raise NotConnectedError(
                    f"no Kubernetes credentials: no kubeconfig ({e}) and not in a cluster ({e2}); "
                    "set KUBECONFIG or pass --kubeconfig"
                ) from e2
            api = k8s_client.ApiClient()
        return cls(api, discovery_cache=discovery_cache)

    def _unreachable(self, e: Exception) -> NotConnectedError:
        host = getattr(getattr(self._api, "configuration", None), "host", "?")
        return NotConnectedError(f"Kubernetes API server at {host} not reachable: {type(e).__name__}: {e}")

    def _resource(self, api_version: str, kind: str) -> Any | None:
        ResourceNotFoundError = _kubernetes("kubernetes.dynamic.exceptions").ResourceNotFoundError

        try:
            return self._dyn.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            return None

    def _call(self, verb: str, kind: str, name: str, fn: Callable[[], Any]) -> Any:
        ApiException = _kubernetes("kubernetes.client.exceptions").ApiException
        from urllib3.exceptions import HTTPError  # kubernetes' own transport

        try:
            return fn()
        except ApiException as e:
            raise _api_error(verb, kind, name, e) from e
        except HTTPError as e:
            raise self._unreachable(e) from e

    # ------------------------------------------------------------------ apply

    def apply(self, objects: Iterable[Obj], *, dry_run: bool = False) -> list[ObjectResult]:
        """Server-side apply each object in order; stops at the first refusal (raised)."""
        out: list[ObjectResult] = []
        for obj in objects:
            api_version, kind, namespace, name = object_key(obj)
            res = self._resource(api_version, kind)
            if res is None:
                if (api_version, kind) in OPTIONAL_KINDS:
                    out.append(ObjectResult(kind, name, namespace, "skipped",
                                            f"{api_version} {kind} is not served: install its operator's CRD"))
                    continue
                raise CrdMissingError(api_version, kind, _install_hint(api_version))
            kwargs: dict[str, Any] = {"field_manager": FIELD_MANAGER, "force_conflicts": True}
            if dry_run:
                kwargs["dry_run"] = "All"
            self._call("apply", kind, name, lambda: self._dyn.server_side_apply(
                res, body=obj, name=name, namespace=namespace or None, **kwargs))
            out.append(ObjectResult(kind, name, namespace, "applied", "dry run" if dry_run else ""))
            keys = (obj["metadata"].get("annotations") or {}).get(GENERATE_KEYS_ANNOTATION)
            if keys and not dry_run:
                out.append(self._generate_keys(res, obj, [k for k in keys.split(",") if k]))
        return out

    def _generate_keys(self, res: Any, obj: Obj, keys: list[str]) -> ObjectResult:
        """Fill the keys a Secret lacks with random values (see the module docstring); keep the rest."""
        api_version, kind, namespace, name = object_key(obj)
        have = (self.get(api_version, kind, name, namespace) or {}).get("data") or {}
        missing = [k for k in keys if not have.get(k)]
        if not missing:
            return ObjectResult(kind, name, namespace, "kept", f"has {', '.join(keys)}; left as it is")
        body = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": namespace},
                "data": {k: base64.b64encode(secrets.token_hex(32).encode()).decode() for k in missing}}
        self._call("apply", kind, name, lambda: self._dyn.server_side_apply(
            res, body=body, name=name, namespace=namespace or None, field_manager=GENERATED_MANAGER))
        return ObjectResult(kind, name, namespace, "generated", f"random {', '.join(missing)}")

    # ------------------------------------------------------------------ status and wait

    def get(self, api_version: str, kind: str, name: str, namespace: str | None) -> Obj | None:
        """The object as the server has it, or None when it does not exist (or its kind is not served)."""
        res = self._resource(api_version, kind)
        if res is None:
            return None
        try:
            got = self._call("get", kind, name, lambda: self._dyn.get(res, name=name, namespace=namespace))
        except KubernetesApiError as e:
            if e.status == 404:
                return None
            raise
        return got.to_dict()

    def served(self, api_version: str, kind: str) -> bool:
        """Whether the server serves ``kind`` at ``api_version`` (its CRD is installed), from discovery."""
        return self._resource(api_version, kind) is not None

    def server_version(self) -> tuple[int, int]:
        """(major, minor) of the API server, from ``/version`` (``"30+"`` on some clouds reads as 30)."""
        got = self._call("get", "Version", "/version", lambda: self._dyn.version["kubernetes"])
        digits = lambda v: int("".join(ch for ch in str(v) if ch.isdigit()) or 0)  # noqa: E731
        return digits(got.get("major")), digits(got.get("minor"))

    def cluster_status(self, name: str, namespace: str) -> ClusterStatus:
        obj = self.get("ray.io/v1", "RayCluster", name, namespace)
        if obj is None:
            return ClusterStatus(name, namespace, None)
        return ClusterStatus.from_object(obj)

    def objects_status(self, objects: Iterable[Obj]) -> list[ObjectResult]:
        """Whether each rendered object exists on the server (``present`` / ``absent``)."""
        out = []
        for obj in objects:
            api_version, kind, namespace, name = object_key(obj)
            got = self.get(api_version, kind, name, namespace or None)
            out.append(ObjectResult(kind, name, namespace, "present" if got is not None else "absent"))
        return out

    def wait_ready(
        self,
        name: str,
        namespace: str,
        *,
        timeout_s: float = 600.0,
        poll_s: float = 2.0,
        on_poll: Callable[[ClusterStatus], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> ClusterStatus:
        """Poll until the RayCluster's ``status.state`` is ``ready``; raise :class:`WaitTimeoutError` after ``timeout_s``.

        A failed cluster (``state == "failed"``) is not waited on: KubeRay does
        not recover it by itself, so the error comes at once with its reason.
        """
        deadline = clock() + timeout_s
        while True:
            st = self.cluster_status(name, namespace)
            if on_poll:
                on_poll(st)
            if st.ready:
                return st
            if st.state == "failed":
                raise KubernetesApiError("wait", "RayCluster", name, 0, "Failed", st.summary())
            if clock() >= deadline:
                raise WaitTimeoutError(name, timeout_s, st)
            sleep(min(poll_s, max(0.0, deadline - clock())))

    # ------------------------------------------------------------------ delete

    def delete(self, objects: Iterable[Obj], *, include_namespace: bool = False) -> list[ObjectResult]:
        """Delete in reverse apply order; already-absent objects count as deleted."""
        out: list[ObjectResult] = []
        for obj in reversed(list(objects)):
            api_version, kind, namespace, name = object_key(obj)
            if kind == "Namespace" and not include_namespace:
                out.append(ObjectResult(kind, name, namespace, "kept", "pass --include-namespace to delete it"))
                continue
            res = self._resource(api_version, kind)
            if res is None:
                out.append(ObjectResult(kind, name, namespace, "deleted", "kind not served"))
                continue
            try:
                self._call("delete", kind, name, lambda: self._dyn.delete(
                    res, name=name, namespace=namespace or None, propagation_policy="Foreground"))
                out.append(ObjectResult(kind, name, namespace, "deleted"))
            except KubernetesApiError as e:
                if e.status != 404:
                    raise
                out.append(ObjectResult(kind, name, namespace, "deleted", "already absent"))
        return out

    # ------------------------------------------------------------------ nodes

    def list_nodes(self, label_selector: str | None = None) -> list[Obj]:
        """Node objects as plain dicts (for ``inventory.node_inventory``)."""
        res = self._resource("v1", "Node")
        if res is None:  # pragma: no cover  (every API server serves nodes)
            raise CrdMissingError("v1", "Node", "not a Kubernetes API server")
        got = self._call("list", "Node", "*", lambda: self._dyn.get(res, label_selector=label_selector))
        return [dict(item) for item in got.to_dict().get("items", [])]


def _install_hint(api_version: str) -> str:
    if api_version.startswith("ray.io/"):
        return ("install the KubeRay operator first: helm install kuberay-operator kuberay/kuberay-operator "
                "--namespace kuberay-system --create-namespace (docs/kubernetes.md)")
    return "install the operator that defines it"
