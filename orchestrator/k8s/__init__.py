"""Kubernetes deployment through KubeRay (guide: docs/kubernetes.md).

* ``config.py``: the one pydantic config (``configs/k8s.yaml``) and its overlays;
* ``render.py``: config -> Kubernetes objects -> kustomize tree (pure);
* ``dashboard.py``: the Grafana dashboard the renderer ships as a ConfigMap;
* ``client.py``: server-side apply, wait for ready, delete (the only I/O);
* ``inventory.py``: GPU inventory from node labels and its cross-check against the agents';
* ``cli.py``: ``orchestrator k8s render|apply|status|delete``.
"""
