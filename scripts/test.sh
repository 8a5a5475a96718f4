#!/usr/bin/env bash
# Installs what Kiln's tests need on a fresh Debian machine, then runs them.
# The tests start their own peers (sushy-tools, ipmi_sim, Mosquitto,
# PostgreSQL) on 127.0.0.1 and stop them.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || need_apt+=(mosquitto mosquitto-clients)
command -v ipmi_sim >/dev/null || need_apt+=(openipmi)
command -v ipmitool >/dev/null || need_apt+=(ipmitool)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need_apt+=(postgresql)
[ -e /usr/include/libvirt/libvirt.h ] || need_apt+=(libvirt-dev pkg-config)
command -v gcc >/dev/null || need_apt+=(gcc python3-dev)  # libvirt-python builds from source
command -v promtool >/dev/null || need_apt+=(prometheus)  # promtool checks the alert rules
command -v chromium >/dev/null || need_apt+=(chromium)  # the dashboard's browser test
command -v debootstrap >/dev/null || need_apt+=(debootstrap)  # the playbook's Debian root
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need_apt[@]}"
fi
python3 -m pip install -q -e '.[dev]'
exec python3 -m pytest "$@"
