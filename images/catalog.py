"""Kiln's catalogue of OS images (``images/catalog.yaml``): load, validate, resolve.

Contract:

- ``load_catalog(path)`` / ``parse_catalog(data)`` return a frozen
  ``Catalog`` or raise ``CatalogError`` listing every problem found (never
  just the first). Only ``version: v1`` is understood; unknown keys are
  rejected, so a typo cannot silently drop a field.
- An image's ``sha256`` is 64 lowercase hex digits, or the literal
  ``operator-supplied``: the operator has not pinned it yet (Kiln never
  invents a checksum). ``Image.sha256`` is ``None`` then and ``verify``
  refuses the image.
- ``url`` is what the BMC fetches (Redfish virtual media ``InsertMedia``):
  ``http`` or ``https``, no credentials, optionally starting with
  ``{image_server}``, which ``Catalog.resolve_url`` replaces by the
  catalogue's ``image_server`` or the one given.
- A Talos entry's ``source.schematic`` may name a schematic file (relative
  to the catalogue, e.g. ``talos/schematic.yaml``): ``load_catalog`` reads it
  into ``source["schematic"]`` (the Image Factory document) and keeps its
  path as ``source["schematic_file"]``; a missing or malformed file is a
  problem like any other.
- Nothing here does I/O except ``load_catalog`` (reads the catalogue and the
  schematic files it names) and ``main``; ``verify`` hashes whatever byte
  chunks it is given.

``python images/catalog.py [PATH]`` validates a catalogue and lists it.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

CATALOG_VERSION = "v1"
OPERATOR_SUPPLIED = "operator-supplied"
IMAGE_SERVER = "{image_server}"
# Image format -> the Redfish virtual media type it is inserted as.
MEDIA_TYPES = {"iso": "CD"}
ARCHES = ("amd64", "arm64", "any")
REQUIRED = ("name", "description", "format", "arch", "url", "sha256")
OPTIONAL = ("gpu_models", "source")
TOP_LEVEL = ("version", "image_server", "images")
DEFAULT_PATH = Path(__file__).resolve().with_name("catalog.yaml")

_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class CatalogError(ValueError):
    """The catalogue is unusable; ``problems`` lists each reason (no secrets)."""

    def __init__(self, origin: str, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__(f"{origin}: " + "; ".join(self.problems))


@dataclass(frozen=True)
class Image:
    """One catalogue entry. ``sha256`` is None while operator-supplied."""

    name: str
    description: str
    format: str
    arch: str
    url: str
    sha256: str | None
    gpu_models: tuple[str, ...] = ()
    source: Mapping[str, Any] = field(default_factory=dict)

    @property
    def pinned(self) -> bool:
        return self.sha256 is not None

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.format]


@dataclass(frozen=True)
class Catalog:
    version: str
    image_server: str | None
    images: tuple[Image, ...]

    def get(self, name: str) -> Image:
        """The image called ``name``; CatalogError when there is none."""
        for image in self.images:
            if image.name == name:
                return image
        raise CatalogError("catalog", [f"no image named {name!r}"])

    def for_gpu(self, gpu_model: str) -> list[Image]:
        """Images meant for nodes with ``gpu_model`` GPUs (e.g. "H200")."""
        return [i for i in self.images if gpu_model.upper() in i.gpu_models]

    def resolve_url(self, image: Image, image_server: str | None = None) -> str:
        """The URL a BMC fetches ``image`` from; ``image_server`` overrides the catalogue's.

        Raises CatalogError when the URL needs an image server and none is known.
        """
        if not image.url.startswith(IMAGE_SERVER):
            return image.url
        server = image_server or self.image_server
        if not server:
            raise CatalogError(
                "catalog",
                [f"image {image.name!r} is served from {IMAGE_SERVER}, and no image server is set"],
            )
        problem = _url_problem(server)
        if problem:
            raise CatalogError("catalog", [f"image server: {problem}"])
        return server.rstrip("/") + image.url.removeprefix(IMAGE_SERVER)


def sha256_of(chunks: Iterable[bytes]) -> str:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def verify(image: Image, chunks: Iterable[bytes]) -> None:
    """Check the image's bytes against its pinned sha256; CatalogError if unpinned or different."""
    if image.sha256 is None:
        raise CatalogError(
            "catalog", [f"image {image.name!r} has no pinned sha256 ({OPERATOR_SUPPLIED})"]
        )
    actual = sha256_of(chunks)
    if actual != image.sha256:
        raise CatalogError(
            "catalog",
            [f"image {image.name!r}: sha256 is {actual}, the catalogue pins {image.sha256}"],
        )


def _url_problem(url: str) -> str | None:
    """Why ``url`` is not a URL a BMC can fetch, or None."""
    try:
        parts = urlsplit(url)
    except ValueError as e:
        return f"malformed URL ({e})"
    if parts.scheme not in ("http", "https"):
        return f"URL scheme {parts.scheme or '(none)'!r} is not http or https"
    if not parts.hostname:
        return "URL has no host"
    if "@" in parts.netloc:
        return "URL carries credentials; serve images without them"
    if "{" in url or "}" in url:
        return f"URL has a placeholder other than a leading {IMAGE_SERVER}"
    return None


def _image(entry: Any, index: int, problems: list[str]) -> Image | None:
    where = f"images[{index}]"
    if not isinstance(entry, dict):
        problems.append(f"{where}: not a mapping")
        return None
    where = f"images[{index}] ({entry.get('name', '?')})"
    before = len(problems)
    problems.extend(f"{where}: missing {key!r}" for key in REQUIRED if key not in entry)
    problems.extend(
        f"{where}: unknown key {key!r}" for key in entry if key not in (*REQUIRED, *OPTIONAL)
    )
    name, url, sha = entry.get("name"), entry.get("url"), entry.get("sha256")
    if "name" in entry and not (isinstance(name, str) and _NAME.match(name)):
        problems.append(f"{where}: name must be lowercase letters, digits, '.' and '-'")
    if "description" in entry and not (
        isinstance(entry["description"], str) and entry["description"].strip()
    ):
        problems.append(f"{where}: description must be a non-empty string")
    if "format" in entry and entry["format"] not in MEDIA_TYPES:
        problems.append(f"{where}: format must be one of {', '.join(MEDIA_TYPES)}")
    if "arch" in entry and entry["arch"] not in ARCHES:
        problems.append(f"{where}: arch must be one of {', '.join(ARCHES)}")
    if "url" in entry:
        text = url if isinstance(url, str) else ""
        check = (
            "http://image-server.invalid" + text.removeprefix(IMAGE_SERVER)
            if text.startswith(IMAGE_SERVER)
            else text
        )
        problem = _url_problem(check) if text else "url must be a string"
        if problem:
            problems.append(f"{where}: {problem}")
    if (
        "sha256" in entry
        and sha != OPERATOR_SUPPLIED
        and not (isinstance(sha, str) and _SHA256.match(sha))
    ):
        problems.append(f"{where}: sha256 must be 64 lowercase hex digits or {OPERATOR_SUPPLIED!r}")
    models = entry.get("gpu_models", [])
    if not (isinstance(models, list) and all(isinstance(m, str) and m for m in models)):
        problems.append(f"{where}: gpu_models must be a list of GPU model names")
        models = []
    source = entry.get("source", {})
    if not isinstance(source, dict):
        problems.append(f"{where}: source must be a mapping")
    if len(problems) > before:
        return None
    return Image(
        name=str(name),
        description=entry["description"].strip(),
        format=entry["format"],
        arch=entry["arch"],
        url=str(url),
        sha256=None if sha == OPERATOR_SUPPLIED else sha,
        gpu_models=tuple(m.upper() for m in models),
        source=source,
    )


def parse_catalog(data: Any, origin: str = "catalog") -> Catalog:
    """Validate parsed YAML; raises CatalogError with every problem found."""
    if not isinstance(data, dict):
        raise CatalogError(origin, ["not a mapping with 'version' and 'images'"])
    problems = [f"unknown top-level key {key!r}" for key in data if key not in TOP_LEVEL]
    if data.get("version") != CATALOG_VERSION:
        problems.append(f"version must be {CATALOG_VERSION!r}, got {data.get('version')!r}")
    server = data.get("image_server")
    if server is not None:
        problem = _url_problem(server) if isinstance(server, str) else "not a string"
        if problem:
            problems.append(f"image_server: {problem}")
    entries = data.get("images")
    if not isinstance(entries, list) or not entries:
        problems.append("images must be a non-empty list")
        entries = []
    images = [_image(entry, i, problems) for i, entry in enumerate(entries)]
    names = [i.name for i in images if i is not None]
    problems.extend(
        f"duplicate image name {n!r}" for n in sorted({n for n in names if names.count(n) > 1})
    )
    if problems:
        raise CatalogError(origin, problems)
    return Catalog(
        version=CATALOG_VERSION,
        image_server=server,
        images=tuple(i for i in images if i is not None),
    )


def load_catalog(path: Path = DEFAULT_PATH) -> Catalog:
    """Read and validate a catalogue file and the schematic files it names;
    raises CatalogError (also for bad YAML)."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise CatalogError(str(path), [f"cannot read: {e}"]) from e
    problems: list[str] = []
    entries = data.get("images") if isinstance(data, dict) else None
    for index, entry in enumerate(entries if isinstance(entries, list) else []):
        source = entry.get("source") if isinstance(entry, dict) else None
        if isinstance(source, dict) and isinstance(source.get("schematic"), str):
            source["schematic_file"] = source["schematic"]
            source["schematic"] = _schematic(Path(path).parent, source["schematic"], problems)
            if source["schematic"] is None:
                problems[-1] = f"images[{index}] ({entry.get('name', '?')}): {problems[-1]}"
    if problems:
        raise CatalogError(str(path), problems)
    return parse_catalog(data, str(path))


def _schematic(base: Path, name: str, problems: list[str]) -> dict[str, Any] | None:
    """An Image Factory schematic file (``customization: ...``), or None with a problem."""
    try:
        doc = yaml.safe_load((base / name).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        problems.append(f"schematic {name}: cannot read: {e}")
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("customization"), dict):
        problems.append(f"schematic {name}: not an Image Factory schematic (no customization)")
        return None
    return doc


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DEFAULT_PATH
    try:
        catalog = load_catalog(path)
    except CatalogError as e:
        print(f"catalog: error: {e}", file=sys.stderr)
        return 1
    for image in catalog.images:
        pinned = image.sha256 if image.sha256 else OPERATOR_SUPPLIED
        gpus = ",".join(image.gpu_models) or "-"
        print(f"{image.name}\t{image.format}\t{image.arch}\t{gpus}\t{pinned}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
