"""A throw-away Debian root for running the playbook for real.

``build_root(directory)`` makes a minimal root of this machine's own Debian
release with ``debootstrap``, from the mirror this machine's apt already
uses (read from ``/etc/apt/sources.list*``), with what a stock Debian host
has before Ansible reaches it: Python (Ansible's modules run on it), apt's
Python bindings (the ``apt`` module), systemd and CA certificates.

Ansible then reaches it through ``community.general.chroot``: modules run
inside the root with the root's own Python, apt and pip, over this machine's
network (a chroot shares it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

# What debootstrap's minbase adds on top of the required packages: a Debian
# host as Ansible finds it (python3 for the modules, python3-apt for the apt
# module, systemd for systemctl and unit files).
INCLUDE = ("python3", "python3-apt", "systemd", "ca-certificates")
FALLBACK_MIRROR = "http://deb.debian.org/debian"
# This machine reaches the package registries through a TLS proxy whose CA
# is in its own bundle: the root trusts the same CAs, at this path, and the
# playbook's pip is pointed at it (kiln_install_pip_extra_args: --cert ...).
ROOT_CA_BUNDLE = "/usr/local/share/kiln-test/ca-bundle.pem"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def codename() -> str:
    """This machine's Debian release (``bookworm``)."""
    text = Path("/etc/os-release").read_text(encoding="utf-8")
    m = re.search(r"^VERSION_CODENAME=\"?([a-z]+)\"?$", text, re.MULTILINE)
    return m.group(1) if m else "bookworm"


def apt_mirror(suite: str) -> str:
    """The main Debian archive URI that apt uses here for ``suite``."""
    sources = Path("/etc/apt")
    # deb822 (.sources): a stanza with "URIs:" and "Suites:" naming suite.
    for path in sorted(sources.glob("sources.list.d/*.sources")):
        for stanza in path.read_text(encoding="utf-8").split("\n\n"):
            fields = dict(
                line.split(":", 1) for line in stanza.splitlines() if re.match(r"^\w[\w-]*:", line)
            )
            suites = fields.get("Suites", "").split()
            types = fields.get("Types", "deb").split()
            if suite in suites and "deb" in types and fields.get("Enabled", "yes").strip() != "no":
                return fields["URIs"].split()[0]
    # one-line format: "deb [opts] URI suite components"
    for path in [sources / "sources.list", *sorted(sources.glob("sources.list.d/*.list"))]:
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            m = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)\s", line)
            if m and m.group(2) == suite:
                return m.group(1)
    return FALLBACK_MIRROR


def build_root(root: Path, log: Path) -> None:
    """debootstrap a minimal root into ``root`` (about a minute on 2 cores)."""
    suite = codename()
    mirror = apt_mirror(suite)
    with log.open("w", encoding="utf-8") as out:
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(INCLUDE)}",
                suite,
                str(root),
                mirror,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            timeout=900,
            check=True,
        )
    # the same trust as this machine (see ROOT_CA_BUNDLE)
    bundle = root / ROOT_CA_BUNDLE.lstrip("/")
    bundle.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HOST_CA_BUNDLE, bundle)
    # debootstrap leaves its downloaded packages behind
    shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)


def in_root(root: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` inside the root (chroot), its environment a clean one."""
    return subprocess.run(
        [
            shutil.which("chroot", path="/usr/sbin:/usr/bin:/sbin:/bin") or "chroot",
            str(root),
            *argv,
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8"},
        timeout=timeout,
        check=False,
    )
