"""``images/catalog.yaml`` and its loader ``images/catalog.py``.

The end-to-end test serves ``images/`` from a loopback HTTP server, checks
the shipped test image against its pinned sha256 as fetched from there, and
has the sushy-tools Redfish emulator (which downloads the image, as a BMC
does) insert it as virtual media through Kiln's BMC layer.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import importlib.util
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from controller.bmc import BmcCredentials, BmcPool, RetryPolicy, parse_bmc_url
from controller.sim.redfish_emulator import RedfishEmulator, make_systems

IMAGES = Path(__file__).resolve().parents[2] / "images"
TEST_IMAGE = IMAGES / "testdata" / "kiln-test.iso"
NVIDIA_EXTENSIONS = {
    "siderolabs/nonfree-kmod-nvidia-production",
    "siderolabs/nvidia-container-toolkit-production",
}
USER, PASSWORD = "kiln-admin", "catalog-test-Pw-9!"


def load_module() -> ModuleType:
    name = "kiln_images_catalog"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, IMAGES / "catalog.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


catalog_py = load_module()


def raw() -> dict[str, Any]:
    return dict(yaml.safe_load((IMAGES / "catalog.yaml").read_text(encoding="utf-8")))


def entry(**changes: Any) -> dict[str, Any]:
    base = {
        "name": "img-1",
        "description": "an image",
        "format": "iso",
        "arch": "amd64",
        "url": "https://images.example/img-1.iso",
        "sha256": "a" * 64,
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def problems_of(data: Any) -> list[str]:
    with pytest.raises(catalog_py.CatalogError) as info:
        catalog_py.parse_catalog(data)
    return list(info.value.problems)


@pytest.fixture
def image_server() -> Iterator[tuple[str, list[str]]]:
    """``images/`` over HTTP on 127.0.0.1: ``(base URL, paths requested)``."""
    requested: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            requested.append(self.path)

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(IMAGES))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requested
    finally:
        server.shutdown()
        server.server_close()


# -- the shipped catalogue -------------------------------------------------------


def test_shipped_catalog_is_valid_v1() -> None:
    catalog = catalog_py.load_catalog(IMAGES / "catalog.yaml")
    assert catalog.version == "v1"
    names = [i.name for i in catalog.images]
    assert len(names) == len(set(names)) >= 3
    for image in catalog.images:
        assert image.media_type == "CD"
        assert image.url.startswith("{image_server}/")


def test_no_checksum_is_invented() -> None:
    """Only the image shipped in the repository has a pinned sha256, and it is right."""
    catalog = catalog_py.load_catalog(IMAGES / "catalog.yaml")
    pinned = [i for i in catalog.images if i.pinned]
    assert [i.name for i in pinned] == ["kiln-test"]
    assert pinned[0].sha256 == hashlib.sha256(TEST_IMAGE.read_bytes()).hexdigest()
    assert all(
        e["sha256"] == "operator-supplied" for e in raw()["images"] if e["name"] != "kiln-test"
    )


def test_test_image_is_a_small_iso9660_image() -> None:
    data = TEST_IMAGE.read_bytes()
    assert len(data) < 128 * 1024
    assert data[32768 + 1 : 32768 + 6] == b"CD001"  # primary volume descriptor


@pytest.mark.parametrize(
    ("gpu", "arch"), [("H200", "amd64"), ("h100", "amd64"), ("GB200", "arm64")]
)
def test_talos_images_bake_in_nvidia_for_each_gpu(gpu: str, arch: str) -> None:
    images = catalog_py.load_catalog(IMAGES / "catalog.yaml").for_gpu(gpu)
    assert len(images) == 1
    image = images[0]
    assert image.arch == arch
    assert image.source["kind"] == "talos-image-factory"
    assert image.source["talos_version"] in image.url
    extensions = image.source["schematic"]["customization"]["systemExtensions"]
    assert set(extensions["officialExtensions"]) == NVIDIA_EXTENSIONS


def test_cli_lists_the_catalog_and_rejects_a_broken_one(tmp_path: Path) -> None:
    ok = subprocess.run(
        [sys.executable, str(IMAGES / "catalog.py")], capture_output=True, text=True, check=False
    )
    assert ok.returncode == 0, ok.stderr
    assert "kiln-test\tiso\tany" in ok.stdout
    bad = tmp_path / "catalog.yaml"
    bad.write_text("version: v2\nimages: []\n", encoding="utf-8")
    failed = subprocess.run(
        [sys.executable, str(IMAGES / "catalog.py"), str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert failed.returncode == 1
    assert failed.stdout == ""
    assert "version must be 'v1'" in failed.stderr
    assert failed.stderr.count("\n") == 1


# -- validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("images", "expected"),
    [
        pytest.param([entry(name=None)], "missing 'name'", id="no-name"),
        pytest.param([entry(sha256=None)], "missing 'sha256'", id="no-sha256"),
        pytest.param([entry(checksum="x")], "unknown key 'checksum'", id="unknown-key"),
        pytest.param([entry(name="Bad Name")], "name must be", id="bad-name"),
        pytest.param([entry(sha256="A" * 64)], "64 lowercase hex", id="upper-hex"),
        pytest.param([entry(sha256="abc")], "64 lowercase hex", id="short-sha"),
        pytest.param([entry(sha256=None, format="qcow2")], "format must be", id="qcow2"),
        pytest.param([entry(arch="riscv")], "arch must be", id="arch"),
        pytest.param([entry(url="ftp://h/x.iso")], "scheme 'ftp'", id="ftp"),
        pytest.param([entry(url="file:///srv/x.iso")], "scheme 'file'", id="file"),
        pytest.param([entry(url="https://u:p@h/x.iso")], "credentials", id="creds-in-url"),
        pytest.param([entry(url="https://h/{version}.iso")], "placeholder", id="placeholder"),
        pytest.param([entry(description="  ")], "description", id="empty-description"),
        pytest.param([entry(gpu_models="H200")], "gpu_models", id="gpu-models-not-list"),
        pytest.param([entry(), entry()], "duplicate image name 'img-1'", id="duplicate"),
        pytest.param([], "non-empty list", id="no-images"),
        pytest.param(["x"], "not a mapping", id="entry-not-mapping"),
    ],
)
def test_invalid_entries_are_rejected(images: list[Any], expected: str) -> None:
    problems = problems_of({"version": "v1", "images": images})
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param({"version": "v2", "images": [entry()]}, "version must be 'v1'", id="v2"),
        pytest.param({"images": [entry()]}, "version must be 'v1'", id="no-version"),
        pytest.param(
            {"version": "v1", "images": [entry()], "mirror": "x"}, "unknown top-level", id="key"
        ),
        pytest.param(
            {"version": "v1", "image_server": "ftp://x", "images": [entry()]},
            "image_server",
            id="server-scheme",
        ),
        pytest.param([1, 2], "not a mapping", id="list"),
    ],
)
def test_invalid_catalogs_are_rejected(data: Any, expected: str) -> None:
    problems = problems_of(data)
    assert any(expected in p for p in problems), problems


def test_every_problem_is_reported_at_once() -> None:
    problems = problems_of({"version": "v0", "images": [entry(arch="x", sha256="y")]})
    assert len(problems) == 3


def test_unreadable_yaml_is_a_catalog_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("version: [v1\n", encoding="utf-8")
    with pytest.raises(catalog_py.CatalogError, match="cannot read"):
        catalog_py.load_catalog(path)


def test_resolve_url_needs_an_image_server() -> None:
    catalog = catalog_py.load_catalog(IMAGES / "catalog.yaml")
    image = catalog.get("kiln-test")
    with pytest.raises(catalog_py.CatalogError, match="no image server"):
        catalog.resolve_url(image)
    assert catalog.resolve_url(image, "http://10.0.0.5:8080/") == (
        "http://10.0.0.5:8080/testdata/kiln-test.iso"
    )
    with pytest.raises(catalog_py.CatalogError, match="credentials"):
        catalog.resolve_url(image, "http://u:p@10.0.0.5/")
    absolute = catalog_py.parse_catalog({"version": "v1", "images": [entry()]})
    assert absolute.resolve_url(absolute.get("img-1")) == "https://images.example/img-1.iso"
    with pytest.raises(catalog_py.CatalogError, match="no image named"):
        catalog.get("nope")


def test_verify_refuses_unpinned_and_mismatched_images() -> None:
    catalog = catalog_py.load_catalog(IMAGES / "catalog.yaml")
    with pytest.raises(catalog_py.CatalogError, match="no pinned sha256"):
        catalog_py.verify(catalog.get("talos-v1.9.5-nvidia-amd64"), [b""])
    with pytest.raises(catalog_py.CatalogError, match="sha256 is"):
        catalog_py.verify(catalog.get("kiln-test"), [TEST_IMAGE.read_bytes()[:-1]])


# -- end to end: image server -> checksum -> Redfish virtual media ----------------


async def test_test_image_is_fetched_verified_and_inserted(
    image_server: tuple[str, list[str]],
) -> None:
    base, requested = image_server
    catalog = catalog_py.load_catalog(IMAGES / "catalog.yaml")
    image = catalog.get("kiln-test")
    url = catalog.resolve_url(image, base)

    def fetch() -> Iterator[bytes]:
        with urllib.request.urlopen(url, timeout=10) as rsp:  # loopback only
            while chunk := rsp.read(16384):
                yield chunk

    catalog_py.verify(image, fetch())

    async with RedfishEmulator(make_systems(1), username=USER, password=PASSWORD) as emu:
        retry = RetryPolicy(attempts=2, base_delay=0.05, max_delay=0.1)
        async with BmcPool(max_workers=2, call_timeout=10.0, retry=retry) as pool:
            bmc = pool.get(
                "node-0",
                parse_bmc_url(emu.system_url("node-00000")),
                BmcCredentials(USER, PASSWORD),
            )
            await bmc.vmedia.insert(url)
            state = await bmc.vmedia.state()
    assert state.inserted is True
    assert state.image_url == url
    # Once for the checksum, once by the emulated BMC itself.
    assert requested.count("/testdata/kiln-test.iso") == 2
