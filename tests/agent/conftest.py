"""Fixtures for the agent's GPU layer: every fake part, and real NVML when present."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from agent.nvml import FakeNvml, NvmlBackend, open_backend

FAKE_SPECS = ("fake:h100", "fake:h200", "fake:gb200")


def real_nvml_or_skip() -> None:
    """Skip the test unless an NVIDIA driver answers nvmlInit."""
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded) as e:
        pytest.skip(f"no NVIDIA driver on this machine: {e}")
    pynvml.nvmlShutdown()


class ManualClock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(params=[*FAKE_SPECS, "real"])
def any_nvml(request: pytest.FixtureRequest) -> Iterator[NvmlBackend]:
    """An initialised backend: each fake part, and real NVML where a driver exists."""
    spec = request.param
    if spec == "real":
        real_nvml_or_skip()
    backend = open_backend(spec, node_name="contract")
    backend.nvmlInit()
    try:
        yield backend
    finally:
        backend.nvmlShutdown()


@pytest.fixture(params=FAKE_SPECS)
def fake(request: pytest.FixtureRequest) -> Iterator[FakeNvml]:
    """An initialised fake node of each part."""
    backend = open_backend(request.param, node_name=f"n-{request.param[5:]}")
    assert isinstance(backend, FakeNvml)
    backend.nvmlInit()
    yield backend


@pytest.fixture
def h200() -> FakeNvml:
    backend = open_backend("fake:h200", node_name="h200-node")
    assert isinstance(backend, FakeNvml)
    backend.nvmlInit()
    return backend
