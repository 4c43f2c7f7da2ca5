"""The ``nvml`` backend: a real node's GPUs through pynvml (``nvidia-ml-py``).

What it reads, per GPU (the NVML call in brackets):

* index, UUID, name -> catalogue model (a model the catalogue does not know
  becomes a generic entry with NVML's memory and no MIG table, and a warning
  is logged once per name), total memory
  (``nvmlDeviceGetIndex``, ``nvmlDeviceGetUUID``, ``nvmlDeviceGetName``,
  ``nvmlDeviceGetMemoryInfo``);
* MIG mode and every existing MIG device with its UUID, profile and
  placement (``nvmlDeviceGetMigMode``, ``nvmlDeviceGetMigDeviceHandleByIndex``,
  ``nvmlDeviceGetGpuInstanceId`` -> ``nvmlDeviceGetGpuInstanceById`` ->
  ``nvmlGpuInstanceGetInfo().placement.start``); the profile is the last word
  of the MIG device's name (``... MIG 3g.40gb``);
* NVLink peers: for each active link (``nvmlDeviceGetNvLinkState``), the
  remote PCI bus id (``nvmlDeviceGetNvLinkRemotePciInfo``) matched against
  the node's GPUs (``nvmlDeviceGetPciInfo``); links to NVSwitches match no GPU;
* health: XID critical errors through an event set
  (``nvmlDeviceRegisterEvents``, ``nvmlEventSetWait_v2``). As NVIDIA's device
  plugin does, XIDs that an application causes (13, 31, 43, 45, 68, 109) do not
  make the GPU unhealthy.

The module object is injected (``nvml=``), so unit tests run against a fake at
the pynvml boundary; ``tests/runtime/fake_nvml.py`` is that fake. Making MIG
instances needs root and is not done here: a MIG-enabled card must carry a
fixed layout made by the administrator.
"""

from __future__ import annotations

import logging
from typing import Any

from orchestrator.control.discovery.base import HealthEvent
from orchestrator.core.catalogue import GpuModel, generic_model, gpu_model, is_known
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.inventory import GpuDevice, MigDevice, NodeInventory

log = logging.getLogger(__name__)

#: XIDs caused by applications, not by the GPU (k8s-device-plugin's default skip list).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _bus(v: Any) -> str:
    return _text(v).lower().lstrip("0")  # NVML pads bus ids with different numbers of zeros by call


def nvml_available(nvml: Any = None) -> bool:
    """True where the NVML library loads and reports at least one GPU."""
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
    except Exception:
        return False
    try:
        return int(nvml.nvmlDeviceGetCount()) > 0
    except Exception:
        return False
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


class NvmlBackend:
    name = "nvml"

    def __init__(self, node_name: str, *, nvml: Any = None, cpu_milli: int | None = None,
                 memory_mib: int | None = None) -> None:
        if nvml is None:
            import pynvml as nvml
        self.nvml = nvml
        self.node_name = node_name
        nvml.nvmlInit()
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(int(nvml.nvmlDeviceGetCount()))]
        self._index_of_uuid: dict[str, int] = {}
        self._events = None
        self._cpu_milli = cpu_milli
        self._memory_mib = memory_mib
        self._warned: set[str] = set()

    # ---- inventory -----------------------------------------------------------------------------
    def inventory(self) -> NodeInventory:
        n = self.nvml
        bus_to_index = {_bus(n.nvmlDeviceGetPciInfo(h).busId): int(n.nvmlDeviceGetIndex(h)) for h in self._handles}
        gpus = []
        for h in self._handles:
            index = int(n.nvmlDeviceGetIndex(h))
            uuid = _text(n.nvmlDeviceGetUUID(h))
            self._index_of_uuid[uuid] = index
            name = _text(n.nvmlDeviceGetName(h))
            memory_mib = int(n.nvmlDeviceGetMemoryInfo(h).total) // (1024 * 1024)
            model = self._model(name, memory_mib)
            mig_on = self._mig_enabled(h) and model.mig_capable
            gpus.append(GpuDevice(
                index=index, uuid=uuid, model=model.name,
                memory_mib=memory_mib,
                mig_enabled=mig_on, mig_devices=self._mig_devices(h) if mig_on else (),
                nvlink_peers=self._nvlink_peers(h, index, bus_to_index),
            ))
        kw: dict[str, Any] = {}
        if self._cpu_milli is not None:
            kw["cpu_milli"] = self._cpu_milli
        if self._memory_mib is not None:
            kw["memory_mib"] = self._memory_mib
        return NodeInventory(name=self.node_name, gpus=tuple(gpus), **kw)

    def utilization(self) -> dict[int, float]:
        """Busy fraction of each GPU over NVML's last sample period (``nvmlDeviceGetUtilizationRates().gpu``).

        A card that cannot say (MIG mode reports NotSupported) is left out: the head models it instead.
        """
        n = self.nvml
        out: dict[int, float] = {}
        for h in self._handles:
            try:
                out[int(n.nvmlDeviceGetIndex(h))] = float(n.nvmlDeviceGetUtilizationRates(h).gpu) / 100.0
            except n.NVMLError:
                continue
        return out

    def _model(self, name: str, memory_mib: int) -> GpuModel:
        if is_known(name):
            return gpu_model(name)
        model = generic_model(name, memory_mib)
        if name not in self._warned:
            self._warned.add(name)
            log.warning("node %s: GPU model %r is not in the catalogue; using %s (%d MiB, MPS and time-slices, "
                        "no MIG table)", self.node_name, name, model.name, memory_mib)
        return model

    def _mig_enabled(self, h: Any) -> bool:
        n = self.nvml
        try:
            current, _pending = n.nvmlDeviceGetMigMode(h)
        except n.NVMLError:  # not MIG-capable (NotSupported)
            return False
        return int(current) == int(n.NVML_DEVICE_MIG_ENABLE)

    def _mig_devices(self, h: Any) -> tuple[MigDevice, ...]:
        n = self.nvml
        out = []
        for i in range(int(n.nvmlDeviceGetMaxMigDeviceCount(h))):
            try:
                mig = n.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except n.NVMLError:  # NotFound: this slot holds no instance
                continue
            profile = _text(n.nvmlDeviceGetName(mig)).split()[-1]
            gi = n.nvmlDeviceGetGpuInstanceById(h, n.nvmlDeviceGetGpuInstanceId(mig))
            start = int(n.nvmlGpuInstanceGetInfo(gi).placement.start)
            out.append(MigDevice(uuid=_text(n.nvmlDeviceGetUUID(mig)), profile=profile, start=start))
        return tuple(sorted(out, key=lambda d: d.start))

    def _nvlink_peers(self, h: Any, index: int, bus_to_index: dict[str, int]) -> tuple[int, ...]:
        n = self.nvml
        peers = set()
        for link in range(int(n.NVML_NVLINK_MAX_LINKS)):
            try:
                if int(n.nvmlDeviceGetNvLinkState(h, link)) != int(n.NVML_FEATURE_ENABLED):
                    continue
                remote = _bus(n.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
            except n.NVMLError:  # NotSupported (no NVLink) or InvalidArgument (no such link)
                break
            peer = bus_to_index.get(remote)
            if peer is not None and peer != index:
                peers.add(peer)
        return tuple(sorted(peers))

    # ---- health events -------------------------------------------------------------------------
    def poll_events(self, timeout_s: float = 0.0) -> list[HealthEvent]:
        n = self.nvml
        if self._events is None:
            self._events = n.nvmlEventSetCreate()
            for h in self._handles:
                try:
                    n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, self._events)
                except n.NVMLError:  # some boards do not report XIDs; they stay healthy
                    pass
        out: list[HealthEvent] = []
        wait_ms = int(timeout_s * 1000)
        while True:
            try:
                data = n.nvmlEventSetWait_v2(self._events, wait_ms)
            except n.NVMLError:  # Timeout: nothing (more) pending
                return out
            wait_ms = 0
            xid = int(data.eventData)
            if xid in APPLICATION_XIDS:
                continue
            uuid = _text(n.nvmlDeviceGetUUID(data.device))
            index = self._index_of_uuid.get(uuid)
            if index is None:
                index = int(n.nvmlDeviceGetIndex(data.device))
            out.append(HealthEvent(index, False, f"XID {xid}", xid=xid))

    def create_mig(self, gpu_index: int, profile: str, start: int) -> str:
        raise InvalidRequestError("gpu.profile", profile, "a MIG instance of the card's fixed layout",
                                  detail="the nvml backend does not create MIG instances (needs root); "
                                  "create the layout with nvidia-smi mig -cgi ... -C")

    def close(self) -> None:
        n = self.nvml
        try:
            if self._events is not None:
                n.nvmlEventSetFree(self._events)
            n.nvmlShutdown()
        except n.NVMLError:
            pass
