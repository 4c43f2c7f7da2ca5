"""Cross-references inside one render: what the API server would accept but the cluster could not run.

Schema validation (``tests/k8s/conftest.py``) says each object is well formed;
it cannot say that a Service selects any pod, that a claim a pod mounts
exists, or that a port a NetworkPolicy opens is one some container listens
on. :func:`dangling_references` walks every rendered object and lists each
reference that points at nothing, so ``orchestrator k8s render`` and
``apply`` refuse such a render before an operator finds out from a pod stuck
in ``ContainerCreating``.

What is checked (a *pod template* is the template of a Deployment, or one
inside a RayCluster, RayJob or RayService; their pods carry the template's
labels, so selectors are matched against those):

* every namespaced object's namespace is rendered;
* every ServiceAccount, Secret, ConfigMap, PersistentVolumeClaim and
  PriorityClass a pod template, a Ray object or a binding names is rendered,
  or is declared as the operator's own (``K8sConfig.external_refs``);
* a ClusterRoleBinding's role is rendered;
* a Service's selector matches some pod template, and its named
  ``targetPort`` is a container port of the pods it selects;
* a NetworkPolicy selects some pod template, each ``podSelector`` it admits
  from matches some pod template, and every port it opens is a container
  port of the pods it selects;
* a PodMonitor selects some pod template, and its endpoint ports are named
  container ports there.

Pure: plain dicts in, :class:`Dangling` records out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from orchestrator.core.errors import OrchestratorError

Obj = dict[str, Any]

#: Kinds whose objects live in a namespace (the rest here are cluster-scoped).
CLUSTER_SCOPED = frozenset({"Namespace", "PriorityClass", "ClusterRole", "ClusterRoleBinding"})


@dataclass(frozen=True)
class Dangling:
    """One reference from ``source`` (kind/name) at ``path`` to a ``kind`` ``name`` that the render lacks."""

    source: str
    path: str
    kind: str
    name: str
    reason: str

    @property
    def message(self) -> str:
        return f"{self.source} {self.path}: {self.kind} {self.name!r}: {self.reason}"


class DanglingReferenceError(OrchestratorError):
    """A render refers to objects it does not contain. Not retryable: the renderer or the config is wrong.

    ``dangling`` lists every such reference; the message names the first few."""

    def __init__(self, config_name: str, dangling: list[Dangling]) -> None:
        self.config_name, self.dangling = config_name, dangling
        shown = "; ".join(d.message for d in dangling[:5])
        more = f" (and {len(dangling) - 5} more)" if len(dangling) > 5 else ""
        super().__init__(f"render of {config_name} refers to what it does not contain: {shown}{more}. "
                         "Declare an object you create yourself in the config (e.g. auth.secret_name, "
                         "checkpoints.claim_name), or report a renderer bug")


@dataclass(frozen=True)
class PodTemplate:
    """A pod template (``metadata`` and ``spec``) found inside ``owner`` (kind/name) at ``path``."""

    owner: str
    path: str
    template: Obj

    @property
    def labels(self) -> dict[str, str]:
        return dict((self.template.get("metadata") or {}).get("labels") or {})

    @property
    def spec(self) -> Obj:
        return self.template["spec"]

    def container_ports(self) -> list[Obj]:
        return [p for c in self.spec.get("containers", []) for p in c.get("ports", [])]


def _src(obj: Obj) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def pod_templates(obj: Obj) -> Iterator[PodTemplate]:
    """Every pod template inside ``obj``'s spec (a mapping whose ``spec`` has ``containers``)."""

    def walk(node: Any, path: str) -> Iterator[PodTemplate]:
        if isinstance(node, dict):
            spec = node.get("spec")
            if isinstance(spec, dict) and "containers" in spec:
                yield PodTemplate(_src(obj), path, node)
                return
            for k, v in node.items():
                yield from walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield from walk(v, f"{path}[{i}]")

    yield from walk(obj.get("spec", {}), ".spec")


def _matches(selector: Obj, labels: dict[str, str]) -> bool:
    """A label selector (``matchLabels`` and the ``In``/``NotIn``/``Exists``/``DoesNotExist`` expressions)."""
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _named_refs(node: Any, path: str = "") -> Iterator[tuple[str, str, str]]:
    """(path, kind, name) of every ServiceAccount, Secret, ConfigMap, PVC and PriorityClass named under ``node``."""
    if isinstance(node, dict):
        for k, v in node.items():
            p = f"{path}.{k}"
            if k == "serviceAccountName" and isinstance(v, str):
                yield p, "ServiceAccount", v
            elif k == "priorityClassName" and isinstance(v, str):
                yield p, "PriorityClass", v
            elif k == "secretKeyRef" and isinstance(v, dict):
                yield p, "Secret", v["name"]
            elif k == "configMapKeyRef" and isinstance(v, dict):
                yield p, "ConfigMap", v["name"]
            elif k == "persistentVolumeClaim" and isinstance(v, dict):
                yield p, "PersistentVolumeClaim", v["claimName"]
            elif k == "secret" and isinstance(v, dict) and "secretName" in v:  # a volume
                yield p, "Secret", v["secretName"]
            elif k == "configMap" and isinstance(v, dict) and "name" in v:  # a volume
                yield p, "ConfigMap", v["name"]
            elif k in ("secretRef", "configMapRef") and isinstance(v, dict):  # envFrom
                yield p, "Secret" if k == "secretRef" else "ConfigMap", v["name"]
            elif k == "imagePullSecrets" and isinstance(v, list):
                for i, s in enumerate(v):
                    yield f"{p}[{i}]", "Secret", s["name"]
            elif k == "authOptions" and isinstance(v, dict) and v.get("secretName"):  # KubeRay's token Secret
                yield f"{p}.secretName", "Secret", v["secretName"]
            else:
                yield from _named_refs(v, p)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _named_refs(v, f"{path}[{i}]")


def _port_served(port: Any, templates: list[PodTemplate]) -> bool:
    """Whether a port (number or name) is a container port of one of ``templates``."""
    for t in templates:
        for cp in t.container_ports():
            if port == cp.get("containerPort") or port == cp.get("name"):
                return True
    return False


def dangling_references(objs: Iterable[Obj], external: Iterable[tuple[str, str]] = ()) -> list[Dangling]:
    """Every reference in ``objs`` that points at nothing rendered and is not in ``external``.

    ``external``: (kind, name) of objects the operator creates (``K8sConfig.external_refs``).
    """
    objs = list(objs)
    have = {(o["kind"], o["metadata"]["name"]) for o in objs} | set(external)
    templates = [t for o in objs for t in pod_templates(o)]
    out: list[Dangling] = []

    def miss(obj: Obj, path: str, kind: str, name: str, reason: str) -> None:
        out.append(Dangling(_src(obj), path, kind, name, reason))

    for o in objs:
        kind, meta = o["kind"], o["metadata"]
        ns = meta.get("namespace")
        if kind not in CLUSTER_SCOPED and ns is not None and ("Namespace", ns) not in have:
            miss(o, ".metadata.namespace", "Namespace", ns, "not rendered")
        for path, ref_kind, name in _named_refs(o.get("spec", {}), ".spec"):
            if (ref_kind, name) not in have:
                miss(o, path, ref_kind, name, "not rendered and not declared as the operator's")
        if kind == "ClusterRoleBinding":
            role = o["roleRef"]
            if (role["kind"], role["name"]) not in have:
                miss(o, ".roleRef", role["kind"], role["name"], "not rendered")
            for i, s in enumerate(o.get("subjects", [])):
                if s["kind"] == "ServiceAccount" and ("ServiceAccount", s["name"]) not in have:
                    miss(o, f".subjects[{i}]", "ServiceAccount", s["name"], "not rendered")
        elif kind == "Service":
            selected = [t for t in templates if _matches({"matchLabels": o["spec"].get("selector") or {}}, t.labels)]
            if not selected:
                miss(o, ".spec.selector", "Pod", str(o["spec"].get("selector")), "selects no pod template")
            for i, p in enumerate(o["spec"].get("ports", [])):
                target = p.get("targetPort", p["port"])
                if selected and not _port_served(target, selected):
                    miss(o, f".spec.ports[{i}].targetPort", "Port", str(target), "no selected container has it")
        elif kind == "NetworkPolicy":
            spec = o["spec"]
            selected = [t for t in templates if _matches(spec.get("podSelector") or {}, t.labels)]
            if not selected:
                miss(o, ".spec.podSelector", "Pod", str(spec.get("podSelector")), "selects no pod template")
            for i, rule in enumerate(spec.get("ingress", [])):
                for j, peer in enumerate(rule.get("from", [])):
                    sel = peer.get("podSelector")
                    # An empty selector admits every pod of the namespace, ours or not: nothing to resolve.
                    if sel and "namespaceSelector" not in peer and not any(_matches(sel, t.labels) for t in templates):
                        miss(o, f".spec.ingress[{i}].from[{j}].podSelector", "Pod", str(sel),
                             "admits traffic from no pod template")
                for j, p in enumerate(rule.get("ports", [])):
                    if selected and not _port_served(p["port"], selected):
                        miss(o, f".spec.ingress[{i}].ports[{j}]", "Port", str(p["port"]),
                             "opened, but no container of the selected pods listens on it")
        elif kind == "PodMonitor":
            selected = [t for t in templates if _matches(o["spec"].get("selector") or {}, t.labels)]
            if not selected:
                miss(o, ".spec.selector", "Pod", str(o["spec"].get("selector")), "selects no pod template")
            for i, ep in enumerate(o["spec"].get("podMetricsEndpoints", [])):
                if "port" in ep and selected and not _port_served(ep["port"], selected):
                    miss(o, f".spec.podMetricsEndpoints[{i}].port", "Port", ep["port"],
                         "no selected container has a port of that name")
    return out
