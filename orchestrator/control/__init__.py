"""The head and the node agent, without Ray.

What lives here: the controller that applies scheduling plans to the lease
ledger (:mod:`.controller`, with its parts :mod:`.leasing`, :mod:`.agent_link`, :mod:`.victims`,
:mod:`.repartition_hooks`), the head's API in-process (:mod:`.service` with :mod:`.service_jobs` and
:mod:`.service_cluster`), the job layer (submission, preemption handshake, retries), the
hand-out that turns an allocation into actor options and environment
variables, the agent core with GPU discovery (NVML or simulated), the ledger
store interface and its in-memory form, and Prometheus metrics (:mod:`.metric_families`,
updated by :mod:`.metrics`).

May import: :mod:`orchestrator.core`, :mod:`orchestrator.scheduling`,
prometheus-client and pynvml (lazily, in discovery).  Never Ray: the Ray port
(:mod:`orchestrator.rayport`) wraps these objects in actors, and tests drive
them in-process.
"""
