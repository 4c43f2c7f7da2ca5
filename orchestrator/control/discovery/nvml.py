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
the pynvml boundary; ``tests/runtime/fake_nvml.py`` is that fake. Making one
MIG instance on demand is not done here: a MIG-enabled card carries a fixed
layout, made by the administrator or by a live repartition.

**Live repartitioning** (:meth:`NvmlBackend.reconfigure_mig`) changes a card's
layout instance by instance, and only with an explicit opt-in: ``ORCHESTRATOR_ALLOW_MIG_RECONFIGURE=1``
in the agent's environment (or ``allow_reconfigure=True``), refused with a
typed error otherwise; it needs the rights ``nvidia-smi mig`` needs (root).
It never changes MIG mode and never resets a GPU. The calls, in order:

1. map the catalogue's profiles to NVML's GPU-instance profile ids
   (``nvmlDeviceGetGpuInstanceProfileInfo`` for each ``NVML_GPU_INSTANCE_PROFILE_*``;
   by the name NVML gives, ``MIG 1g.10gb``, else by compute slices and the
   nearest memory size, the first such id winning, so a ``+me`` variant never
   stands in for the plain profile);
2. destroy the compute instances, then the GPU instance, of each instance the
   new layout does not keep (same profile at the same placement start): found
   by ``nvmlDeviceGetGpuInstances`` and ``nvmlGpuInstanceGetInfo().placement``,
   destroyed with ``nvmlGpuInstanceGetComputeInstances``,
   ``nvmlComputeInstanceDestroy``, ``nvmlGpuInstanceDestroy``. Kept instances,
   and the processes on them, are not touched: MIG makes and destroys GPU
   instances one at a time while the others run;
3. create each added instance at its placement and one compute instance
   spanning it (``nvmlDeviceCreateGpuInstanceWithPlacement``,
   ``nvmlGpuInstanceGetComputeInstanceProfileInfo``,
   ``nvmlGpuInstanceCreateComputeInstance``);
4. read the card's MIG devices back; if creating failed or they differ, try to
   put the removed instances back (new UUIDs; kept ones never moved) and raise.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Any, Sequence

from orchestrator.control.discovery.base import HealthEvent
from orchestrator.core import env
from orchestrator.core.catalogue import GpuModel, generic_model, gpu_model, is_known
from orchestrator.core.errors import InvalidRequestError
from orchestrator.core.inventory import GpuDevice, MigDevice, NodeInventory
from orchestrator.scheduling.repartition import MigSlot, layout_text, validate_layout

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
                 memory_mib: int | None = None, allow_reconfigure: bool | None = None) -> None:
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
        #: may reconfigure_mig destroy and create MIG instances (None: ``ORCHESTRATOR_ALLOW_MIG_RECONFIGURE=1``)
        self.allow_reconfigure = allow_reconfigure

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

    # ---- live repartitioning ----------------------------------------------------------------------
    def reconfigure_mig(self, gpu_index: int, layout: Sequence[tuple[str, int]]) -> tuple[MigDevice, ...]:
        """Replace a MIG-enabled card's layout (see the module docstring); its new MIG devices."""
        allowed = self.allow_reconfigure
        if allowed is None:
            allowed = os.environ.get(env.ALLOW_MIG_RECONFIGURE, "") == "1"
        if not allowed:
            raise InvalidRequestError(env.ALLOW_MIG_RECONFIGURE, os.environ.get(env.ALLOW_MIG_RECONFIGURE), "1",
                                      detail="live MIG repartitioning destroys every instance on the card; "
                                      "the node's operator opts in by setting it in the agent's environment")
        n = self.nvml
        h = next((x for x in self._handles if int(n.nvmlDeviceGetIndex(x)) == gpu_index), None)
        if h is None:
            raise InvalidRequestError("gpu_index", gpu_index, [int(n.nvmlDeviceGetIndex(x)) for x in self._handles])
        name = _text(n.nvmlDeviceGetName(h))
        model = self._model(name, int(n.nvmlDeviceGetMemoryInfo(h).total) // (1024 * 1024))
        if not (model.mig_capable and self._mig_enabled(h)):
            raise InvalidRequestError("gpu_index", gpu_index, "a GPU with MIG mode on",
                                      detail=f"{name} has MIG off or none; MIG mode is never changed here")
        slots = validate_layout(model.name, [f"{p}@{s}" for p, s in layout])
        ids = self._gi_profile_ids(h, model)
        missing = sorted({s.profile for s in slots} - set(ids))
        if missing:
            raise InvalidRequestError("layout", missing, sorted(ids), detail=f"NVML on GPU {gpu_index} offers no such "
                                      "GPU-instance profile")
        old = tuple(sorted(MigSlot(d.start, d.profile) for d in self._mig_devices(h)))
        removed = tuple(x for x in old if x not in slots)
        added = tuple(x for x in slots if x not in old)
        self._destroy(h, removed)
        try:
            self._create(h, model, ids, added)
            made = self._mig_devices(h)
            got = tuple(sorted(MigSlot(d.start, d.profile) for d in made))
            if got != slots:
                raise InvalidRequestError("layout", layout_text(got), layout_text(slots),
                                          detail=f"GPU {gpu_index} reports another layout than the one made")
            return made
        except Exception as e:
            restored = "not restored"
            try:
                now = tuple(sorted(MigSlot(d.start, d.profile) for d in self._mig_devices(h)))
                self._destroy(h, tuple(x for x in now if x not in old))
                self._create(h, model, ids, tuple(x for x in old if x not in now))
                restored = f"old layout {layout_text(old)} restored"
            except Exception as again:  # the card keeps what could be made; the inventory will say what
                log.error("GPU %s: could not restore MIG layout %s: %s", gpu_index, layout_text(old), again)
            raise InvalidRequestError("layout", layout_text(slots), "a layout NVML accepts",
                                      detail=f"GPU {gpu_index}: {type(e).__name__}: {e}; {restored}") from e

    def _gi_profile_ids(self, h: Any, model: GpuModel) -> dict[str, int]:
        """Catalogue profile name -> NVML GPU-instance profile id, for this card."""
        n = self.nvml
        infos = []
        for const in range(int(n.NVML_GPU_INSTANCE_PROFILE_COUNT)):
            try:
                infos.append(n.nvmlDeviceGetGpuInstanceProfileInfo(h, const))
            except n.NVMLError:  # NotSupported / InvalidArgument: the card has no such profile
                continue
        out: dict[str, int] = {}
        names = {p.name for p in model.mig_profiles}
        for info in infos:
            label = _text(getattr(info, "name", b"") or b"").split()
            if label and label[-1] in names:
                out.setdefault(label[-1], int(info.id))
        for info in infos:  # an old driver without names: compute slices, then the nearest memory
            if _text(getattr(info, "name", b"") or b"").strip():
                continue
            same = [p for p in model.mig_profiles if p.compute_slices == int(info.sliceCount)]
            if same:
                best = min(same, key=lambda p: abs(p.memory_mib - int(info.memorySizeMB)))
                out.setdefault(best.name, int(info.id))
        return out

    def _instances(self, get: Any, parent: Any, profile_id: int, handle_type: Any, most: int = 8) -> list[Any]:
        """NVML's array-and-count listing calls as a list of handles."""
        handles = (handle_type * most)()
        count = ctypes.c_uint(0)
        get(parent, profile_id, handles, ctypes.byref(count))
        return [handles[i] for i in range(count.value)]

    def _destroy(self, h: Any, slots: Sequence[MigSlot]) -> None:
        """Destroy the compute instances, then the GPU instance, of each of ``slots``; every other instance on
        the card is left as it is. A card's GPU instances never overlap, so the placement start names one."""
        n = self.nvml
        starts = {s.start for s in slots}
        if not starts:
            return
        for const in range(int(n.NVML_GPU_INSTANCE_PROFILE_COUNT)):
            try:
                info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, const)
            except n.NVMLError:
                continue
            for gi in self._instances(n.nvmlDeviceGetGpuInstances, h, int(info.id), n.c_nvmlGpuInstance_t):
                if int(n.nvmlGpuInstanceGetInfo(gi).placement.start) not in starts:
                    continue
                for ci_const in range(int(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
                    try:
                        ci_info = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                            gi, ci_const, n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
                    except n.NVMLError:
                        continue
                    for ci in self._instances(n.nvmlGpuInstanceGetComputeInstances, gi, int(ci_info.id),
                                              n.c_nvmlComputeInstance_t):
                        n.nvmlComputeInstanceDestroy(ci)
                n.nvmlGpuInstanceDestroy(gi)

    def _create(self, h: Any, model: GpuModel, ids: dict[str, int], slots: Sequence[MigSlot]) -> None:
        """Create each GPU instance at its placement, and one compute instance spanning it."""
        n = self.nvml
        for s in slots:
            prof = model.profile(s.profile)
            placement = n.c_nvmlGpuInstancePlacement_t()
            placement.start, placement.size = s.start, prof.memory_slices
            gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, ids[s.profile], ctypes.byref(placement))
            ci_const = getattr(n, f"NVML_COMPUTE_INSTANCE_PROFILE_{prof.compute_slices}_SLICE")
            ci_info = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci_const,
                                                                     n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            n.nvmlGpuInstanceCreateComputeInstance(gi, int(ci_info.id))

    def close(self) -> None:
        n = self.nvml
        try:
            if self._events is not None:
                n.nvmlEventSetFree(self._events)
            n.nvmlShutdown()
        except n.NVMLError:
            pass
