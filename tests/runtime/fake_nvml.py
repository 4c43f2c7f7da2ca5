"""FakeNvml: a stand-in for the ``pynvml`` module, at its boundary, for the ``nvml`` backend's unit tests.

It implements only the calls :mod:`orchestrator.control.discovery.nvml` makes,
with pynvml's names, return shapes (structs with the same attribute names) and
error classes, over a declared list of GPUs. It is a fake: nothing here talks
to a driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    pass


class NVMLError_NotFound(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):
    pass


@dataclass
class FakeMig:
    uuid: str
    profile: str
    start: int
    gi_id: int


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


class FakeNvml:
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 18
    nvmlEventTypeXidCriticalError = 8
    NVMLError = NVMLError
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Timeout = NVMLError_Timeout

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.initialised = 0
        self.pending_xids: list[tuple[int, int]] = []  # (gpu index, xid)
        self.registered: list[int] = []

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
        if i >= len(h.migs):
            raise NVMLError_NotFound()
        return h.migs[i]

    def nvmlDeviceGetGpuInstanceId(self, mig: FakeMig) -> int:
        return mig.gi_id

    def nvmlDeviceGetGpuInstanceById(self, h: FakeGpu, gi_id: int) -> FakeMig:
        return next(m for m in h.migs if m.gi_id == gi_id)

    def nvmlGpuInstanceGetInfo(self, gi: FakeMig) -> SimpleNamespace:
        return SimpleNamespace(id=gi.gi_id, placement=SimpleNamespace(start=gi.start, size=1))

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
