"""FakeNvml: a stand-in for the ``pynvml`` module, at its boundary, for the ``nvml`` backend's unit tests.

It implements only the calls :mod:`orchestrator.control.discovery.nvml` makes,
with pynvml's names, return shapes (structs with the same attribute names) and
error classes, over a declared list of GPUs. It is a fake: nothing here talks
to a driver.
"""

from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace

from orchestrator.core.catalogue import gpu_model


class NVMLError(Exception):
    pass


class NVMLError_NotFound(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):
    pass


class NVMLError_InUse(NVMLError):
    pass


class NVMLError_InsufficientResources(NVMLError):
    pass


class NVMLError_NoPermission(NVMLError):
    pass


class FakePlacement(ctypes.Structure):
    """pynvml's ``c_nvmlGpuInstancePlacement_t``: passed by reference, as the C API takes it."""

    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


@dataclass
class FakeMig:
    uuid: str
    profile: str
    start: int
    gi_id: int
    has_ci: bool = True  # a GPU instance is a MIG device only once it has its compute instance


@dataclass
class FakeGpu:
    index: int
    uuid: str
    name: str
    memory_bytes: int
    bus_id: str
    mig_mode: int | None = None  # None: the card is not MIG-capable (NotSupported)
    migs: list[FakeMig] = field(default_factory=list)
    nvlink_to: list[str] = field(default_factory=list)  # remote bus ids, one per active link
    utilization_pct: int | None = 0  # None: NotSupported (as NVML answers for a card in MIG mode)
    fail_create: set[str] = field(default_factory=set)  # profiles whose GPU-instance creation fails (a driver's no)


@dataclass(frozen=True)
class FakeCi:
    """A compute instance spanning its whole GPU instance (the only kind the backend makes)."""

    gi: FakeMig


def _gi_profiles(model: str) -> dict[int, tuple[int, str, int]]:
    """NVML profile constant -> (profile id, name, memory slices) for a model, as ``nvidia-smi mig -lgip`` lists
    them on an A100-80GB: 1g (const 0, id 19), 2g (1, 14), 3g (2, 9), 4g (3, 5), 7g (4, 0), 1g+me (7, 20),
    1g with two memory slices (9, 15)."""
    spec = gpu_model(model)
    out: dict[int, tuple[int, str, int]] = {}
    ids = {(1, 1): (0, 19), (2, 2): (1, 14), (3, 4): (2, 9), (4, 4): (3, 5), (7, 8): (4, 0), (1, 2): (9, 15)}
    for p in spec.mig_profiles:
        const, pid = ids[(p.compute_slices, p.memory_slices)]
        out[const] = (pid, p.name, p.memory_slices)
        if (p.compute_slices, p.memory_slices) == (1, 1):
            out[7] = (20, p.name + "+me", 1)  # the media-extension variant: same size, must never stand in for 1g
    return out


class FakeNvml:
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 18
    nvmlEventTypeXidCriticalError = 8
    NVMLError = NVMLError
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_InUse = NVMLError_InUse
    NVMLError_InsufficientResources = NVMLError_InsufficientResources
    NVMLError_NoPermission = NVMLError_NoPermission
    NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
    NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = 0x0
    NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE = 0x1
    NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 0x2
    NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE = 0x3
    NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE = 0x4
    NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 0x9
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0x0
    c_nvmlGpuInstance_t = ctypes.py_object  # handles in the listing arrays are the fake's own objects
    c_nvmlComputeInstance_t = ctypes.py_object
    c_nvmlGpuInstancePlacement_t = FakePlacement

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.initialised = 0
        self.pending_xids: list[tuple[int, int]] = []  # (gpu index, xid)
        self.registered: list[int] = []
        self.calls: list[str] = []  # the MIG-changing calls made, in order (what a test asserts)
        self.names = True  # False: an old driver whose profile info carries no name
        self._ids = itertools.count(100)

    # init / count / handles
    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    # per device (a GPU or a MIG device)
    def nvmlDeviceGetIndex(self, h: FakeGpu) -> int:
        return h.index

    def nvmlDeviceGetUUID(self, h: FakeGpu | FakeMig) -> str:
        return h.uuid

    def nvmlDeviceGetName(self, h: FakeGpu | FakeMig) -> bytes | str:
        if isinstance(h, FakeMig):
            parent = next(g for g in self.gpus if h in g.migs)
            return f"{parent.name} MIG {h.profile}"
        return h.name.encode()  # older pynvml returns bytes

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(total=h.memory_bytes, used=0, free=h.memory_bytes)

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> SimpleNamespace:
        if h.utilization_pct is None:
            raise NVMLError_NotSupported()
        return SimpleNamespace(gpu=h.utilization_pct, memory=0)

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(busId=h.bus_id.encode())

    # MIG
    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> tuple[int, int]:
        if h.mig_mode is None:
            raise NVMLError_NotSupported()
        return h.mig_mode, h.mig_mode

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGpu) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGpu, i: int) -> FakeMig:
        devices = [m for m in h.migs if m.has_ci]
        if i >= len(devices):
            raise NVMLError_NotFound()
        return devices[i]

    def nvmlDeviceGetGpuInstanceId(self, mig: FakeMig) -> int:
        return mig.gi_id

    def nvmlDeviceGetGpuInstanceById(self, h: FakeGpu, gi_id: int) -> FakeMig:
        return next(m for m in h.migs if m.gi_id == gi_id)

    def nvmlGpuInstanceGetInfo(self, gi: FakeMig) -> SimpleNamespace:
        return SimpleNamespace(id=gi.gi_id, placement=SimpleNamespace(start=gi.start, size=1))

    # MIG: making and destroying instances (live repartitioning)
    def _profiles(self, h: FakeGpu) -> dict[int, tuple[int, str, int]]:
        if h.mig_mode != 1:
            raise NVMLError_NotSupported()
        return _gi_profiles(h.name)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: FakeGpu, profile: int, version: int = 2) -> SimpleNamespace:
        try:
            pid, name, mem = self._profiles(h)[profile]
        except KeyError:
            raise NVMLError_NotSupported() from None
        spec = gpu_model(h.name)
        return SimpleNamespace(id=pid, sliceCount=int(name[0]), instanceCount=8 // mem,
                               memorySizeMB=spec.memory_mib * mem // 8 - 256, name=f"MIG {name}".encode() if self.names else b"")

    def _by_id(self, h: FakeGpu, pid: int) -> tuple[str, int]:
        for p, name, mem in self._profiles(h).values():
            if p == pid:
                return name, mem
        raise NVMLError("invalid argument")

    @staticmethod
    def _fill(arr: object, count_ref: object, items: list[object]) -> None:
        for i, x in enumerate(items):
            arr[i] = x  # type: ignore[index]
        count_ref._obj.value = len(items)  # type: ignore[attr-defined]

    def nvmlDeviceGetGpuInstances(self, h: FakeGpu, pid: int, arr: object, count_ref: object) -> int:
        name, _ = self._by_id(h, pid)
        self._fill(arr, count_ref, [m for m in h.migs if m.profile == name])
        return 0

    def _parent(self, gi: FakeMig) -> FakeGpu:
        return next(g for g in self.gpus if any(m is gi for m in g.migs))

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: FakeMig, profile: int, eng: int,
                                                     version: int = 2) -> SimpleNamespace:
        slices = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}.get(profile)
        if slices is None or slices > int(gi.profile[0]):
            raise NVMLError_NotSupported()
        return SimpleNamespace(id=profile, sliceCount=slices)

    def nvmlGpuInstanceGetComputeInstances(self, gi: FakeMig, ci_pid: int, arr: object, count_ref: object) -> int:
        full = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}[int(gi.profile[0])]
        self._fill(arr, count_ref, [FakeCi(gi)] if gi.has_ci and ci_pid == full else [])
        return 0

    def nvmlComputeInstanceDestroy(self, ci: FakeCi) -> int:
        self.calls.append(f"destroy-ci {ci.gi.profile}@{ci.gi.start}")
        ci.gi.has_ci = False
        return 0

    def nvmlGpuInstanceDestroy(self, gi: FakeMig) -> int:
        if gi.has_ci:
            raise NVMLError_InUse()
        parent = self._parent(gi)
        parent.migs = [m for m in parent.migs if m is not gi]
        self.calls.append(f"destroy-gi {gi.profile}@{gi.start}")
        return 0

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h: FakeGpu, pid: int, placement_ref: object) -> FakeMig:
        placement = placement_ref._obj  # type: ignore[attr-defined]
        name, mem = self._by_id(h, pid)
        prof = gpu_model(h.name).profile(name.removesuffix("+me"))
        taken = 0
        for m in h.migs:
            taken |= gpu_model(h.name).profile(m.profile.removesuffix("+me")).mask(m.start)
        if name in h.fail_create or placement.start not in prof.placements or placement.size != mem or (
                taken & prof.mask(placement.start)):
            raise NVMLError_InsufficientResources()
        gi_id = next(self._ids)
        gi = FakeMig(f"MIG-fake-{gi_id}", name, placement.start, gi_id, has_ci=False)
        h.migs.append(gi)
        self.calls.append(f"create-gi {name}@{placement.start}")
        return gi

    def nvmlGpuInstanceCreateComputeInstance(self, gi: FakeMig, ci_pid: int) -> FakeCi:
        if gi.has_ci or ci_pid != {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}[int(gi.profile[0])]:
            raise NVMLError_InsufficientResources()
        gi.has_ci = True
        self.calls.append(f"create-ci {gi.profile}@{gi.start}")
        return FakeCi(gi)

    # NVLink
    def nvmlDeviceGetNvLinkState(self, h: FakeGpu, link: int) -> int:
        if not h.nvlink_to:
            raise NVMLError_NotSupported()
        if link >= len(h.nvlink_to):
            return 0
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: FakeGpu, link: int) -> SimpleNamespace:
        return SimpleNamespace(busId=h.nvlink_to[link])

    # events
    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: FakeGpu, types: int, es: str) -> None:
        self.registered.append(h.index)

    def nvmlEventSetWait_v2(self, es: str, timeout_ms: int) -> SimpleNamespace:
        if not self.pending_xids:
            raise NVMLError_Timeout()
        index, xid = self.pending_xids.pop(0)
        return SimpleNamespace(device=self.gpus[index], eventData=xid, eventType=8)

    def nvmlEventSetFree(self, es: str) -> None:
        pass


def two_a100s_one_mig() -> FakeNvml:
    """GPU 0 without MIG, GPU 1 with 3g.40gb@0 and 1g.10gb@6; NVLink between them (and to an NVSwitch)."""
    return FakeNvml([
        FakeGpu(0, "GPU-aaaa", "NVIDIA A100-SXM4-80GB", 80 * 1024**3, "00000000:07:00.0",
                mig_mode=0, nvlink_to=["00000000:0F:00.0", "00000000:99:00.0"]),
        FakeGpu(1, "GPU-bbbb", "NVIDIA A100-SXM4-80GB", 80 * 1024**3, "0000:0F:00.0", mig_mode=1,
                migs=[FakeMig("MIG-1111", "1g.10gb", 6, 13), FakeMig("MIG-2222", "3g.40gb", 0, 2)],
                nvlink_to=["00000000:07:00.0"]),
    ])
