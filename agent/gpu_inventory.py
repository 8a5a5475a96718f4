"""Read a node's GPU identity through an NVML backend.

``read_inventory`` blocks on NVML: call it from a worker thread
(``await asyncio.to_thread(read_inventory, nvml)``). NVML must be initialised.
"""

from __future__ import annotations

import ctypes
import logging
import uuid as uuidlib
from dataclasses import dataclass
from typing import Any

import pynvml

from agent.nvml.backend import NvmlBackend

__all__ = [
    "GpuIdentity",
    "NodeInventory",
    "architecture_name",
    "clique_from_fabric",
    "read_clique",
    "read_inventory",
]

log = logging.getLogger(__name__)

_ARCH_NAMES = {
    pynvml.NVML_DEVICE_ARCH_KEPLER: "Kepler",
    pynvml.NVML_DEVICE_ARCH_MAXWELL: "Maxwell",
    pynvml.NVML_DEVICE_ARCH_PASCAL: "Pascal",
    pynvml.NVML_DEVICE_ARCH_VOLTA: "Volta",
    pynvml.NVML_DEVICE_ARCH_TURING: "Turing",
    pynvml.NVML_DEVICE_ARCH_AMPERE: "Ampere",
    pynvml.NVML_DEVICE_ARCH_ADA: "Ada",
    pynvml.NVML_DEVICE_ARCH_HOPPER: "Hopper",
    pynvml.NVML_DEVICE_ARCH_BLACKWELL: "Blackwell",
}


@dataclass(frozen=True)
class GpuIdentity:
    """Static identity of one GPU. A lost GPU keeps its index; unread fields are empty."""

    index: int
    uuid: str
    name: str
    serial: str
    pci_bus_id: str
    pci_device_id: int
    architecture: str
    memory_total_mib: int
    clique: str


@dataclass(frozen=True)
class NodeInventory:
    """Driver version and the GPUs of one node, in NVML index order."""

    driver_version: str
    gpus: tuple[GpuIdentity, ...]


def architecture_name(arch: int) -> str:
    """Human name of an NVML_DEVICE_ARCH_* value ("Hopper"), or "unknown(N)"."""
    return _ARCH_NAMES.get(arch, f"unknown({arch})")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def clique_from_fabric(info: Any) -> str:
    """The NVLink-domain label "<clusterUuid>.<cliqueId>" from fabric info, or "".

    A GPU is in a multi-node NVLink domain when fabric registration completed
    successfully with a non-zero cluster UUID (GB200 NVL72); HGX boards report
    a zero UUID.
    """
    raw = bytes(info.clusterUuid)
    if (
        info.state != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        or info.status != pynvml.NVML_SUCCESS
        or not any(raw)
    ):
        return ""
    return f"{uuidlib.UUID(bytes=raw)}.{info.cliqueId}"


def read_clique(nvml: NvmlBackend, handle: Any) -> str:
    """Read the GPU's NVLink-domain label (see :func:`clique_from_fabric`); "" if unsupported."""
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    try:
        nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
        return ""
    return clique_from_fabric(info)


def _read_gpu(nvml: NvmlBackend, index: int) -> GpuIdentity:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    pci = nvml.nvmlDeviceGetPciInfo_v3(handle)
    return GpuIdentity(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        name=_text(nvml.nvmlDeviceGetName(handle)),
        serial=_text(nvml.nvmlDeviceGetSerial(handle)),
        pci_bus_id=_text(pci.busId),
        pci_device_id=int(pci.pciDeviceId),
        architecture=architecture_name(int(nvml.nvmlDeviceGetArchitecture(handle))),
        memory_total_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024),
        clique=read_clique(nvml, handle),
    )


def read_inventory(nvml: NvmlBackend) -> NodeInventory:
    """Read driver version and every GPU's identity. Blocking; raises NVMLError.

    A GPU that answers GPU_IS_LOST is listed with empty identity fields (and
    logged) so that the node can still report; other NVML errors propagate.
    """
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    gpus = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            gpus.append(_read_gpu(nvml, index))
        except pynvml.NVMLError_GpuIsLost:
            log.warning("GPU %s is lost; listing it without identity", index)
            gpus.append(GpuIdentity(index, "", "", "", "", 0, "", 0, ""))
    return NodeInventory(driver_version=driver, gpus=tuple(gpus))
