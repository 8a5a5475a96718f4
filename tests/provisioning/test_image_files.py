"""The Talos schematic and the GPU Operator values that images/ ships."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from images.catalog import load_catalog

pytestmark = pytest.mark.timeout(30)

IMAGES = Path(__file__).resolve().parents[2] / "images"
NVIDIA = [
    "siderolabs/nonfree-kmod-nvidia-production",
    "siderolabs/nvidia-container-toolkit-production",
]


def test_talos_schematic_names_the_nvidia_extensions() -> None:
    doc = yaml.safe_load((IMAGES / "talos" / "schematic.yaml").read_text())
    assert doc["customization"]["systemExtensions"]["officialExtensions"] == NVIDIA


def test_catalogue_talos_entries_are_defined_by_the_schematic_file() -> None:
    catalog = load_catalog(IMAGES / "catalog.yaml")
    talos = [i for i in catalog.images if i.source.get("kind") == "talos-image-factory"]
    assert len(talos) == 2
    for image in talos:
        assert image.source["schematic_file"] == "talos/schematic.yaml"
        extensions = image.source["schematic"]["customization"]["systemExtensions"]
        assert extensions["officialExtensions"] == NVIDIA


def test_gpu_operator_leaves_driver_and_toolkit_to_the_host() -> None:
    values = yaml.safe_load((IMAGES / "gpu-operator-values.yaml").read_text())
    assert values["driver"]["enabled"] is False
    assert values["toolkit"]["enabled"] is False


def test_a_missing_schematic_file_is_a_catalogue_problem(tmp_path: Path) -> None:
    data = yaml.safe_load((IMAGES / "catalog.yaml").read_text())
    data["images"][0]["source"]["schematic"] = "talos/nope.yaml"
    (tmp_path / "catalog.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=r"images\[0\].*schematic talos/nope.yaml: cannot read"):
        load_catalog(tmp_path / "catalog.yaml")
