"""What the renderer writes: GPU requests per sharing mode, node selection, hardening, auth, RBAC, policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.deploy.k8s.config import K8sConfig, load_config, parse_config
from orchestrator.deploy.k8s.render import (
    HEADER,
    apply_json_patch,
    gfd_products,
    overlay_ops,
    render_objects,
    render_tree,
    stale_files,
    to_yaml_stream,
    write_tree,
)

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "k8s.yaml"


@pytest.fixture(scope="module")
def configs() -> tuple[K8sConfig, dict[str, K8sConfig]]:
    return load_config(CONFIG)


def _by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def _groups(cluster_spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["groupName"]: g for g in cluster_spec["workerGroupSpecs"]}


def _pod_specs(objs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for o in objs:
        spec = o.get("spec", {})
        for cluster in (spec, spec.get("rayClusterConfig", {})):
            if "headGroupSpec" in cluster:
                yield cluster["headGroupSpec"]["template"]["spec"]
                for g in cluster["workerGroupSpecs"]:
                    yield g["template"]["spec"]
        if "submitterPodTemplate" in spec:
            yield spec["submitterPodTemplate"]["spec"]
        if o["kind"] == "Deployment":  # the GCS's Redis
            yield spec["template"]["spec"]


def test_worker_groups_request_what_each_sharing_mode_needs(configs: tuple[K8sConfig, dict[str, K8sConfig]]) -> None:
    base, _ = configs
    cluster = _by_kind(render_objects(base), "RayCluster")[0]["spec"]
    groups = _groups(cluster)

    def limits(group: str) -> dict[str, str]:
        return groups[group]["template"]["spec"]["containers"][0]["resources"]["limits"]

    assert limits("h100-whole")["nvidia.com/gpu"] == "8"
    # all-balanced on 8 cards, mixed strategy: one resource per profile.
    assert {k: v for k, v in limits("a100-mig").items() if k.startswith("nvidia.com/")} == {
        "nvidia.com/mig-1g.10gb": "16", "nvidia.com/mig-2g.20gb": "8", "nvidia.com/mig-3g.40gb": "8"}
    assert limits("a10-timesliced")["nvidia.com/gpu"] == "1"
    assert limits("t4-mps")["nvidia.com/gpu"] == "1"
    # Ray's GPU count is the cards the pod sees (the node's agent holds what no lease covers), each card also
    # its own resource; every GPU pod's raylet runs the orchestrator's hook (docs/ray-native.md).
    assert groups["a100-mig"]["rayStartParams"]["num-gpus"] == "8"
    assert groups["a10-timesliced"]["rayStartParams"]["num-gpus"] == "1"
    for name in ("a100-mig", "a10-timesliced", "h100-whole", "t4-mps"):
        env = {e["name"]: e.get("value") for e in groups[name]["template"]["spec"]["containers"][0]["env"]}
        assert env["RAY_RUNTIME_ENV_HOOK"] == "orchestrator.rayport.native.runtime_env_hook"
        assert env["ORCHESTRATOR_RAY_AUTO_LEASE"] == "1"
        assert env["ORCHESTRATOR_NAMESPACE"] == "rgo"  # Ray's namespace of the head, not Kubernetes'
    assert groups["a100-mig"]["resources"] == {f"rgo-gpu-{i}": "1" for i in range(8)}
    assert groups["a10-timesliced"]["resources"] == {"rgo-gpu-0": "1"}
    for g in groups.values():  # Guaranteed QoS
        r = g["template"]["spec"]["containers"][0]["resources"]
        assert r["requests"] == r["limits"]
    assert cluster["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"


def _node_terms(group: dict[str, Any]) -> dict[str, tuple[str, list[str]]]:
    terms = group["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return {e["key"]: (e["operator"], e["values"]) for e in terms["nodeSelectorTerms"][0]["matchExpressions"]}


def test_nodes_are_selected_by_the_gpu_operator_labels(configs: tuple[K8sConfig, dict[str, K8sConfig]]) -> None:
    base, overlays = configs
    groups = _groups(_by_kind(render_objects(base), "RayCluster")[0]["spec"])
    whole = _node_terms(groups["h100-whole"])
    assert "NVIDIA-H100-80GB-HBM3" in whole["nvidia.com/gpu.product"][1]
    assert whole["nvidia.com/gpu.sharing-strategy"] == ("NotIn", ["mps", "time-slicing"])
    mig = _node_terms(groups["a100-mig"])
    assert mig["nvidia.com/mig.strategy"] == ("In", ["mixed"])
    assert mig["nvidia.com/mig.config"] == ("In", ["all-balanced"])
    assert _node_terms(groups["t4-mps"])["nvidia.com/gpu.sharing-strategy"] == ("In", ["mps"])
    assert "Tesla-T4-SHARED" in _node_terms(groups["t4-mps"])["nvidia.com/gpu.product"][1]
    assert _node_terms(groups["a10-timesliced"])["nvidia.com/gpu.sharing-strategy"] == ("In", ["time-slicing"])
    for g in groups.values():
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in g["template"]["spec"]["tolerations"]
    # A cpu pool (the dev overlay's, simulating GPUs) asks for no GPU node.
    dev = _groups(_by_kind(render_objects(overlays["dev"]), "RayCluster")[0]["spec"])["sim-a100"]
    assert "affinity" not in dev["template"]["spec"] and "tolerations" not in dev["template"]["spec"]


def test_gfd_products_come_from_nvml_names() -> None:
    cfg = parse_config({"pools": [{"name": "a", "sharing": "whole", "gpu_model": "A100-80GB"}]})[0]
    assert gfd_products(cfg.pools[0]) == ["NVIDIA-A100-80GB-PCIe", "NVIDIA-A100-SXM4-80GB"]


def test_every_container_is_non_root_without_escalation_and_read_only(configs: tuple[K8sConfig, dict[str, K8sConfig]]) -> None:
    for cfg in (configs[0], *configs[1].values()):
        objs = render_objects(cfg)
        specs = list(_pod_specs(objs))
        assert len(specs) >= 2  # head and at least one worker group
        for spec in specs:
            assert spec["securityContext"]["runAsNonRoot"] is True
            assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            for c in spec["containers"] + spec.get("initContainers", []):
                sc = c["securityContext"]
                assert sc["allowPrivilegeEscalation"] is False, c["name"]
                assert sc["readOnlyRootFilesystem"] is True, c["name"]
                assert sc["capabilities"] == {"drop": ["ALL"]}
                assert sc.get("privileged") is not True
            mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
            assert "/tmp" in mounts  # Ray's session dir is writable although the root is not


def test_only_the_head_gets_a_service_account_token(configs: tuple[K8sConfig, dict[str, K8sConfig]]) -> None:
    cluster = _by_kind(render_objects(configs[0]), "RayCluster")[0]["spec"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == "gpu-orchestrator-head" and head["automountServiceAccountToken"] is True
    for g in cluster["workerGroupSpecs"]:
        assert g["template"]["spec"]["automountServiceAccountToken"] is False


def test_rbac_is_read_only_on_nodes_and_nothing_else(configs: tuple[K8sConfig, dict[str, K8sConfig]]) -> None:
    objs = render_objects(configs[0])
    (role,) = _by_kind(objs, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    (binding,) = _by_kind(objs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-orchestrator-head", "namespace": "gpu-orchestrator"}]
    assert not _by_kind(objs, "Role") and not _by_kind(objs, "RoleBinding")


def test_auth_modes() -> None:
    def cluster(auth: dict[str, Any]) -> dict[str, Any]:
        cfg = parse_config({"pools": [{"name": "g", "sharing": "whole", "gpu_model": "T4"}], "auth": auth})[0]
        return _by_kind(render_objects(cfg), "RayCluster")[0]["spec"]

    assert cluster({"mode": "kuberay"})["authOptions"] == {"mode": "token"}
    assert cluster({"mode": "kuberay", "secret_name": "tok"})["authOptions"] == {"mode": "token", "secretName": "tok"}
    spec = cluster({"mode": "secret", "secret_name": "tok"})
    assert "authOptions" not in spec
    env = {e["name"]: e for e in spec["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    assert env["RAY_AUTH_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "tok", "key": "auth_token"}}
    assert "authOptions" not in cluster({"mode": "disabled"})


def test_network_policy_admits_the_dashboard_only_from_the_namespace(configs: tuple[K8sConfig, dict[str, K8sConfig]]) -> None:
    (np,) = [p for p in _by_kind(render_objects(configs[0]), "NetworkPolicy") if p["metadata"]["name"].endswith("-ingress")
             and not p["metadata"]["name"].endswith("-redis-ingress")]
    spec = np["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["podSelector"] == {"matchLabels": {"app.kubernetes.io/instance": "gpu-orchestrator"}}
    rules = spec["ingress"]
    # Only the same-namespace rule and the operator's carry the dashboard/job API port.
    with_dashboard = [r for r in rules if any(p["port"] == 8265 for p in r.get("ports", []))]
    assert [r["from"] for r in with_dashboard] == [
        [{"podSelector": {}}],
        [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kuberay-system"}}}],
    ]
    # Every rule is scoped: no rule admits all sources.
    assert all(r.get("from") for r in rules)
    monitoring = rules[-1]
    assert {p["port"] for p in monitoring["ports"]} == {8080, 8081}


def test_scheduler_labels_go_on_the_ray_cluster_and_service(configs: tuple[K8sConfig, dict[str, K8sConfig]]) -> None:
    base, overlays = configs
    prod = render_objects(overlays["prod"])
    for kind in ("RayCluster", "RayService"):
        assert _by_kind(prod, kind)[0]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-team"
    # A RayJob on an existing cluster is not Kueue's to admit: the cluster already is.
    assert "kueue.x-k8s.io/queue-name" not in _by_kind(prod, "RayJob")[0]["metadata"]["labels"]
    kai = parse_config({"pools": [{"name": "g", "sharing": "whole", "gpu_model": "T4"}],
                        "scheduler": {"kind": "kai", "queue": "research"}})[0]
    assert _by_kind(render_objects(kai), "RayCluster")[0]["metadata"]["labels"]["kai.scheduler/queue"] == "research"
    assert not any("queue" in k for k in _by_kind(render_objects(base), "RayCluster")[0]["metadata"]["labels"])


def test_the_job_and_service_run_through_the_orchestrator(configs: tuple[K8sConfig, dict[str, K8sConfig]]) -> None:
    objs = render_objects(configs[0])
    (job,) = _by_kind(objs, "RayJob")
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": "gpu-orchestrator"}
    assert job["spec"]["entrypoint"].startswith("orchestrator submit")
    (svc,) = _by_kind(objs, "RayService")
    assert "orchestrator.serve.app:app" in svc["spec"]["serveConfigV2"]
    pod = svc["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    head = pod["containers"][0]
    (sidecar,) = pod["initContainers"]
    assert "orchestrator.deploy.kuberay head --supervise" in sidecar["command"][-1]
    assert {p["name"] for p in head["ports"]} >= {"serve", "orch-metrics", "dashboard"}


def test_the_head_runs_as_a_restartable_sidecar_that_reads_the_policy_configmap(
        configs: tuple[K8sConfig, dict[str, K8sConfig]]) -> None:
    from orchestrator.core.config import parse_config
    from orchestrator.core.priorities import SchedulerConfig

    objs = render_objects(configs[0])
    (rc,) = _by_kind(objs, "RayCluster")
    pod = rc["spec"]["headGroupSpec"]["template"]["spec"]
    (sidecar,) = pod["initContainers"]
    # A native sidecar: the kubelet restarts it whenever it exits, whatever the pod's restartPolicy; its
    # stdout is `kubectl logs -c orchestrator-head`. No process is started from a lifecycle hook.
    assert sidecar["name"] == "orchestrator-head" and sidecar["restartPolicy"] == "Always"
    script = sidecar["command"][-1]
    assert "nohup" not in script and script.rstrip().split("; ")[-1].startswith("exec python -m orchestrator.deploy")
    assert "--supervise" in script and "--config /etc/orchestrator/cluster.yaml" in script
    for c in pod["containers"]:
        assert "orchestrator.deploy" not in str(c.get("lifecycle", {}))
    # The head reads the policy file from the ConfigMap the base renders, mounted where its --config points.
    (volume,) = [v for v in pod["volumes"] if v["name"] == "head-config"]
    (mount,) = [m for m in sidecar["volumeMounts"] if m["name"] == "head-config"]
    assert mount["mountPath"] == "/etc/orchestrator"
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == volume["configMap"]["name"]]
    cluster_file = parse_config(yaml.safe_load(cm["data"]["cluster.yaml"]))
    assert cluster_file.scheduler == SchedulerConfig.load(CONFIG.parent / "priorities.yaml")
    assert "research" in cluster_file.scheduler.queues  # configs/priorities.yaml's, not the built-in default


def test_the_heads_settings_are_one_tree_with_the_config_and_reach_its_file_and_every_pod(
        configs: tuple[K8sConfig, dict[str, K8sConfig]]) -> None:
    from orchestrator.core.config import parse_config as parse_cluster_file
    from orchestrator.core.errors import ConfigError

    base = configs[0].model_dump(mode="json", exclude_unset=True)
    base["head"]["settings"] = {"namespace": "team-a", "head_name": "team-a-head", "heartbeat_interval_s": 2.0,
                                "tuning": {"lend_timeout_s": 12.0}}
    cfg, _ = parse_config(base)
    objs = render_objects(cfg)
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == f"{cfg.name}-head-config"]
    s = parse_cluster_file(yaml.safe_load(cm["data"]["cluster.yaml"])).settings
    # the config's own choices and the deployment's, in the file the head loads with the model that checked them
    assert (s.namespace, s.head_name, s.heartbeat_interval_s, s.tuning.lend_timeout_s) == ("team-a", "team-a-head", 2.0, 12.0)
    assert (s.discovery, s.metrics_host, s.metrics_port) == ("auto", "0.0.0.0", cfg.metrics_port)
    named = {(e["name"], e["value"]) for spec in _pod_specs(objs) for c in spec.get("containers", []) + spec.get(
        "initContainers", []) for e in c.get("env", []) if e["name"] in ("ORCHESTRATOR_NAMESPACE", "ORCHESTRATOR_HEAD_NAME")}
    assert named == {("ORCHESTRATOR_NAMESPACE", "team-a"), ("ORCHESTRATOR_HEAD_NAME", "team-a-head")}
    # what the deployment sets is not the config's to set; what the head would refuse is refused at render
    for bad, field in (({"metrics_port": 9100}, "head.settings.metrics_port"),
                       ({"discovery": "simulated"}, "head.settings.discovery"),
                       ({"heartbeat_intervall_s": 2}, "head.settings.heartbeat_intervall_s"),
                       ({"tuning": {"lend_timeout_s": 0}}, "head.settings.tuning.lend_timeout_s")):
        base["head"]["settings"] = bad
        with pytest.raises(ConfigError) as e:
            parse_config(base)
        assert e.value.field == field


def test_rendering_is_deterministic_and_anchor_free(configs: tuple[K8sConfig, dict[str, K8sConfig]]) -> None:
    a = to_yaml_stream(render_objects(configs[0]))
    b = to_yaml_stream(render_objects(load_config(CONFIG)[0]))
    assert a == b
    assert "&id" not in a and "*id" not in a


def test_committed_k8s_tree_equals_a_fresh_render(configs: tuple[K8sConfig, dict[str, K8sConfig]]) -> None:
    """k8s/ never drifts from configs/k8s.yaml: fix with `orchestrator k8s render --out k8s`."""
    tree = render_tree(*configs)
    assert stale_files(tree, REPO / "k8s") == []


def test_write_tree_removes_only_its_own_stale_files(tmp_path: Path, configs: tuple[K8sConfig, dict[str, K8sConfig]]) -> None:
    base, overlays = configs
    write_tree(render_tree(base, overlays), tmp_path)
    mine = tmp_path / "overlays" / "old" / "kustomization.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text(HEADER + "kind: Kustomization\n")
    hand = tmp_path / "base" / "extra.yaml"
    hand.write_text("# written by a person\n")
    assert stale_files(render_tree(base, overlays), tmp_path) == ["overlays/old/kustomization.yaml"]
    write_tree(render_tree(base, {}), tmp_path)
    assert not mine.exists() and hand.exists()
    assert not (tmp_path / "overlays" / "dev" / "kustomization.yaml").exists()


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text("ab/~", max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text("ab/~", max_size=3), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text("ab/~", max_size=3), _json, max_size=4),
       st.dictionaries(st.text("ab/~", max_size=3), _json, max_size=4))
def test_overlay_ops_take_the_base_to_the_overlay(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert apply_json_patch(a, overlay_ops(a, b)) == b
    assert overlay_ops(a, a) == []
