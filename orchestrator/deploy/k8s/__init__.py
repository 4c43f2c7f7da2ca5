"""Kubernetes: KubeRay manifests, the API client and node-label inventories.

What lives here: the pydantic config for a Kubernetes deployment
(:mod:`.config`, its parts in :mod:`.fields`, :mod:`.pools`, :mod:`.specs` and
:mod:`.model`), rendering RayCluster/RayJob/RayService manifests from it
(:mod:`.render`, one module per object family: :mod:`.namespace`, :mod:`.redis`,
:mod:`.monitoring`, :mod:`.pods`, :mod:`.workloads`, over :mod:`.manifest`; the
kustomize tree in :mod:`.kustomize`), the thin client over the ``kubernetes`` package
(:mod:`.client`), GPU inventory read from node labels written by NVIDIA's GPU
feature discovery (:mod:`.inventory`) and the dashboard port-forward helper.

May import: :mod:`orchestrator.core` and the ``kubernetes`` package (loaded
lazily by :mod:`.client`, so rendering works without it).
"""
