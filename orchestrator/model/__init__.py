"""The vocabulary: GPU models, inventories and requests. Pure data, no Ray, no I/O."""

from orchestrator.model.catalogue import CATALOGUE, GpuModel, MigProfile, gpu_model
from orchestrator.model.inventory import GpuDevice, MigDevice, NodeInventory
from orchestrator.model.request import GpuRequest, Isolation, ShareKind

__all__ = [
    "CATALOGUE", "GpuModel", "MigProfile", "gpu_model",
    "GpuDevice", "MigDevice", "NodeInventory",
    "GpuRequest", "Isolation", "ShareKind",
]
