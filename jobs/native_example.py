"""Plain Ray GPU code, unchanged, on a lease: what the README's first SDK example runs.

    orchestrator submit --gpu 1 --wait --working-dir . -- python jobs/native_example.py

Under the orchestrator the tasks run on the card the job's lease holds: ``ray.get_gpu_ids()`` names it, and a
task that asks for more GPUs than the lease holds fails at once with ``LeaseCapacityError``
(docs/ray-native.md). It prints one ``NATIVE={...}`` line (JSON) that tests/integration/test_native.py reads.
"""

import json
import os

import ray

ray.init()


@ray.remote(num_gpus=1)
def where() -> dict:
    return {"gpu_ids": [str(i) for i in ray.get_gpu_ids()], "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "node": ray.get_runtime_context().get_node_id()}


out = {"driver_cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
       "tasks": ray.get([where.remote(), where.remote()], timeout=120)}
try:
    where.options(num_gpus=2).remote()  # one card leased: this asks for two
    out["over_the_lease"] = "submitted"
except Exception as e:  # LeaseCapacityError under the orchestrator
    out["over_the_lease"] = f"{type(e).__name__}: {e}"
print("NATIVE=" + json.dumps(out))
