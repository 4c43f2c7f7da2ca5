"""Deployment: bringing a cluster up and down.

What lives here: the embedded local cluster (:mod:`.local`, with its parts
:mod:`.launch_plan`, :mod:`.cluster_env`, :mod:`.processes` and :mod:`.teardown`, and the raylet
processes it starts in :mod:`.raylet`), the entry point a KubeRay head pod
runs (:mod:`.kuberay`) and the Kubernetes side (:mod:`.k8s`: config,
manifest rendering, API client, inventory from node labels).

May import: every layer below it (core, scheduling, control, rayport, sdk).
Only the CLI, the scenarios and the benchmarks import it.
"""
