"""The cluster-facing half of the head's API: :class:`ClusterMethods`, a part of
:class:`~orchestrator.control.service.HeadService`.

Status and metrics, the Kubernetes inventory check, the dashboard's announced address, the time-window clock
and MIG repartitions. :class:`~orchestrator.control.service.HeadService` stays the one class that implements
:class:`~orchestrator.core.api.HeadApi`: this mixin holds no state of its own (every attribute it uses is set
by ``HeadService.__init__``, annotated below), and every API method it defines is wrapped by the service's
edge check like the service's own.

Invariants:

* the controller's state changes only through the controller's own calls (``set_day_clock``,
  ``repartition_mig``); everything else here reads, or changes only soft state that is sent again or
  expires (the last inventory check, the dashboard's address until its ``ttl_s``, inference latencies
  counted into the metrics);
* what every user sees is never a link out of the cluster: an announced dashboard address must be
  :func:`cluster_local_url`;
* arguments are checked here, each refusal an ``InvalidRequestError`` naming the field.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Sequence

from pydantic import ValidationError

from orchestrator.control.controller import HeadController
from orchestrator.control.inventory_check import InventoryCheck
from orchestrator.control.metrics import OTHER_SERVICE, HeadMetrics
from orchestrator.core.api import Json
from orchestrator.core.clock import DayClock
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.validation import typed_error
from orchestrator.scheduling.repartition import target_from

#: What :func:`cluster_local_url` accepts, in words (for the error that names the field).
CLUSTER_LOCAL = ("a URL on this cluster: a loopback or private address, localhost, or a Kubernetes service name "
                 "(*.svc, *.cluster.local), without user or password")


def cluster_local_url(url: str) -> bool:
    """Whether ``url`` points inside the cluster (see :data:`CLUSTER_LOCAL`). Pure: no name is resolved."""
    import ipaddress
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if parts.username or parts.password:
            return False
        _ = parts.port  # a malformed port raises
    except ValueError:
        return False
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost" or host.endswith((".svc", ".svc.cluster.local", ".cluster.local"))
    return ip.is_loopback or (ip.is_private and not ip.is_unspecified)


class ClusterMethods:
    """The cluster-facing methods of :class:`~orchestrator.control.service.HeadService`; see the module docstring."""

    # Set by HeadService.__init__ (this class holds no state of its own).
    ctl: HeadController
    clock: Callable[[], float]
    metrics: HeadMetrics
    metrics_port: int | None
    metrics_url: str | None
    inventory_check: InventoryCheck | None
    restored: int
    started_at: float
    _dashboard: tuple[str, float] | None

    def set_day_clock(self, day_clock: Mapping[str, Any]) -> Json:
        if not isinstance(day_clock, Mapping):
            raise InvalidRequestError("day_clock", day_clock, 'a mapping like {"speedup": 720, "start": "06:00"}')
        try:
            dc = DayClock.model_validate(dict(day_clock))
        except (ValidationError, InvalidRequestError) as e:
            t = typed_error(e, "day_clock", DayClock) if isinstance(e, ValidationError) else e
            if not t.field.startswith("day_clock"):  # a validator's own error: name it where it stands
                t = InvalidRequestError(f"day_clock.{t.field}", t.value, t.allowed, detail=t.detail)
            raise t from None
        self.ctl.set_day_clock(dc.build())
        return self.ctl.window().to_json() if self.ctl.sched_config.windows else {}

    def status(self) -> Json:
        st = self.ctl.status()
        if self.inventory_check is not None:
            st["inventory_check"] = self.inventory_check.summary()
            for n in st["nodes"]:
                n["k8s_inventory"] = self.inventory_check.node_line(n["name"])
        st["endpoints"] = self._endpoints()
        st["repartitions"] = self.ctl.repartitions.to_json()
        return st

    def _endpoints(self) -> Json:
        """Where the head's metrics and a live dashboard (if one announced itself lately) answer."""
        dash = self._dashboard
        live = dash is not None and dash[1] >= self.clock()
        return {"metrics_url": self.metrics_url, "dashboard_url": dash[0] if live and dash else None}

    def ping(self) -> Json:
        return {"restored_leases": self.restored, "started_at": self.started_at, "pid": os.getpid(),
                "registered_nodes": self.ctl.registered_nodes(), "metrics_port": self.metrics_port}

    def agent_inventories(self) -> list[Json]:
        return [r.inventory.model_dump(mode="json") for r in self.ctl.nodes.registered()]

    def report_inventory_check(self, report: Mapping[str, Any]) -> Json:
        check = InventoryCheck.parse(report, at=self.clock())
        self.inventory_check = check
        self.metrics.set_inventory_disagreements(check.counts())
        return {"disagreements": len(check.disagreements), "errors": check.errors}

    def metric_samples(self) -> Json:
        return {"at": self.clock(), "samples": self.metrics.samples()}

    def metric_history(self, since: float | None = None) -> Json:
        return self.metrics.curves.since(since, self.clock())

    def record_inference(self, service: str, latencies_s: Sequence[float], slo_s: float | None = None) -> Json:
        if not service or not isinstance(service, str):
            raise InvalidRequestError("service", service, "a service name")
        try:
            lats = [float(x) for x in latencies_s]
        except (TypeError, ValueError):
            raise InvalidRequestError("latencies_s", latencies_s, "a list of seconds") from None
        if any(not (x >= 0) for x in lats):
            raise InvalidRequestError("latencies_s", [x for x in lats if not (x >= 0)], "seconds >= 0")
        if slo_s is not None and not (float(slo_s) > 0):
            raise InvalidRequestError("slo_s", slo_s, "seconds > 0, or None")
        misses = self.metrics.record_inference(service, lats, None if slo_s is None else float(slo_s))
        return {"requests": len(lats), "slo_misses": misses,
                "service": service if service in self.metrics.inference_services else OTHER_SERVICE}

    def repartition_mig(self, target: str | Mapping[str, Any], dry_run: bool = False) -> Json:
        return self.ctl.request_repartition(target_from(target), dry_run=dry_run)

    def announce_dashboard(self, url: str, ttl_s: float = 30.0) -> Json:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise InvalidRequestError("url", url, "an http:// or https:// URL")
        if not cluster_local_url(url):  # status shows it to every user: never a link that leads out of the cluster
            raise InvalidRequestError("url", url, CLUSTER_LOCAL,
                                      detail="the dashboard's address is shown to every user of the cluster")
        if not (0 < float(ttl_s) <= 3600):
            raise InvalidRequestError("ttl_s", ttl_s, "seconds in (0, 3600]")
        self._dashboard = (url, self.clock() + float(ttl_s))
        return self._endpoints()
