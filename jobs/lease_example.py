"""Take a GPU lease from inside a plain Ray job, run an actor on the leased devices, give them back.

Submitted with Ray's own command, not ours -- the orchestrator only has to be running:

    ray job submit --address http://127.0.0.1:<api-port> --working-dir . -- python jobs/lease_example.py --gpu mig:1g.10gb

(``orchestrator status`` prints the API address as ``cluster.dashboard``.) The
driver finds the head in its own cluster (``ORCHESTRATOR_NAMESPACE`` picks a
namespace other than ``rgo``), blocks until the lease is granted, starts one
actor with ``lease.actor_options()`` -- pinned to the lease's node, with
``CUDA_VISIBLE_DEVICES`` set to the leased GPU or MIG UUID -- and prints what
that actor sees. Leaving the ``with`` block releases the lease.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import ray

import orchestrator


@ray.remote
class Worker:
    """Stands in for a model server or trainer: reports the devices it was given."""

    def devices(self) -> dict[str, object]:
        return {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                # what Ray holds for it: its share of Ray's GPU, inside its lease's placement group
                "assigned": ray.get_runtime_context().get_assigned_resources(),
                "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
                "node_id": ray.get_runtime_context().get_node_id(),
                "mps": {k: v for k, v in os.environ.items() if k.startswith("CUDA_MPS_")}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", default="mig:1g.10gb", help="What to lease, as `orchestrator submit --gpu` takes it")
    p.add_argument("--priority", default="training", help="Priority class")
    p.add_argument("--timeout", type=float, default=120.0, help="Seconds to wait for the grant")
    a = p.parse_args(argv)
    with orchestrator.lease(a.gpu, priority=a.priority, timeout=a.timeout) as lease:
        alloc = lease.allocation
        print(f"lease {lease.lease_id} granted: {alloc.get('kind')} on {lease.node} GPU {alloc.get('gpu_indices')}",
              flush=True)
        worker = Worker.options(**lease.actor_options()).remote()
        seen = ray.get(worker.devices.remote(), timeout=120)
        print(f"CUDA_VISIBLE_DEVICES={seen['CUDA_VISIBLE_DEVICES']}", flush=True)
        print("SEEN " + json.dumps(seen, sort_keys=True), flush=True)
        ok = seen["CUDA_VISIBLE_DEVICES"] == lease.cuda_visible_devices and seen["node_id"] == lease.handout["node_id"]
        ray.kill(worker)
    print(f"lease {lease.lease_id} released", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
