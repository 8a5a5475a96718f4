"""Every unusable option stops ``kiln-controller`` before it serves: one line on
stderr naming the option and the problem, exit status 2, no traceback.

Each case runs the real entry point in a subprocess, as systemd would.
"""

from __future__ import annotations

import socket
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from startup_runs import run

from controller.sim.ports import free_port

GOOD_PROFILE = "version: v1\nname: {name}\ngpu:\n  persistence_mode: true\n"


@dataclass
class Case:
    """``args`` may name files ``setup`` makes under the test's directory."""

    args: Callable[[Path], list[str]]
    expected: str  # the line, after "kiln-controller: error: ", contains this
    setup: Callable[[Path], None] = lambda _: None


def write(name: str, content: str | bytes) -> Callable[[Path], None]:
    def make(root: Path) -> None:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")

    return make


def both(*steps: Callable[[Path], None]) -> Callable[[Path], None]:
    def make(root: Path) -> None:
        for step in steps:
            step(root)

    return make


def read_only_sqlite(root: Path) -> None:
    db = root / "ro" / "kiln.db"
    db.parent.mkdir()
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (x INTEGER)")


NOT_POSITIVE = "must be more than 0 seconds"
CASES = {
    "power-sync-interval-0": Case(
        lambda _: ["--power-sync-interval", "0"], f"--power-sync-interval: {NOT_POSITIVE}, not 0"
    ),
    "power-sync-spread-above-1": Case(
        lambda _: ["--power-sync-spread", "1.5"],
        "--power-sync-spread: must be a share from 0 to 1, not 1.5",
    ),
    "power-sync-spread-text": Case(
        lambda _: ["--power-sync-spread", "half"],
        "--power-sync-spread: 'half' is not a share from 0 to 1",
    ),
    "reconcile-interval-negative": Case(
        lambda _: ["--reconcile-interval", "-1"], f"--reconcile-interval: {NOT_POSITIVE}, not -1"
    ),
    "sample-interval-0": Case(lambda _: ["--sample-interval", "0"], "--sample-interval: must"),
    "max-report-interval-negative": Case(
        lambda _: ["--max-report-interval", "-1"],
        "--max-report-interval: must be more than 0 seconds (or 0: off), not -1",
    ),
    "max-report-interval-text": Case(
        lambda _: ["--max-report-interval", "slow"],
        "--max-report-interval: 'slow' is not a number of seconds (or 0: off)",
    ),
    "agent-silent-after-inf": Case(
        lambda _: ["--agent-silent-after", "inf"], "--agent-silent-after: must"
    ),
    "bmc-thermal-interval-negative": Case(
        lambda _: ["--bmc-thermal-interval", "-2.5"], "--bmc-thermal-interval: must"
    ),
    "bmc-call-timeout-0": Case(
        lambda _: ["--bmc-call-timeout", "0"], f"--bmc-call-timeout: {NOT_POSITIVE}, not 0"
    ),
    "bmc-power-resend-after-nan": Case(
        lambda _: ["--bmc-power-resend-after", "nan"], "--bmc-power-resend-after: must"
    ),
    "bmc-workers-0": Case(lambda _: ["--bmc-workers", "0"], "--bmc-workers: must be at least 1"),
    "interval-not-a-number": Case(
        lambda _: ["--power-sync-interval", "soon"], "--power-sync-interval: 'soon' is not"
    ),
    "max-preparing-0": Case(lambda _: ["--max-preparing", "0"], "--max-preparing: must be at"),
    "max-firmware-per-rack-negative": Case(
        lambda _: ["--max-firmware-updates-per-rack", "-1"], "--max-firmware-updates-per-rack:"
    ),
    "agent-relays-without-agent-listen": Case(
        lambda _: ["--agent-relays", "2"],
        "--agent-relays N and --agent-listen HOST:PORT go together",
    ),
    "agent-listen-without-relays": Case(
        lambda _: ["--agent-listen", "127.0.0.1:7000"], "go together"
    ),
    "agent-relays-negative": Case(
        lambda _: ["--agent-relays", "-1", "--agent-listen", "127.0.0.1:7000"],
        "--agent-relays",
    ),
    "bmc-readers-negative": Case(
        lambda _: ["--bmc-readers", "-1"], "--bmc-readers -1: cannot be negative"
    ),
    "bmc-readers-text": Case(lambda _: ["--bmc-readers", "two"], "--bmc-readers"),
    "agent-listen-port-0": Case(
        lambda _: ["--agent-relays", "1", "--agent-listen", "127.0.0.1:0"],
        "--agent-listen 127.0.0.1:0: needs a fixed port",
    ),
    "listen-port-out-of-range": Case(
        lambda _: ["--listen", "127.0.0.1:99999"], "--listen: port must be a number from 0 to 65535"
    ),
    "listen-without-port": Case(
        lambda _: ["--listen", "notahost"], "--listen: wants HOST:PORT, not 'notahost'"
    ),
    "listen-not-local": Case(
        lambda _: ["--listen", "192.0.2.1:50051"], "--listen 192.0.2.1:50051: not an address of"
    ),
    "mqtt-without-port": Case(lambda _: ["--mqtt", "broker"], "--mqtt: wants HOST:PORT"),
    "profiles-missing": Case(
        lambda root: ["--profiles", str(root / "nope")], "--profiles {root}/nope: no such directory"
    ),
    "profiles-is-a-file": Case(
        lambda root: ["--profiles", str(root / "p.yaml")],
        "--profiles {root}/p.yaml: is a file",
        write("p.yaml", GOOD_PROFILE.format(name="a")),
    ),
    "profiles-duplicate-name": Case(
        lambda root: ["--profiles", str(root / "profiles")],
        "b.yaml (--profiles): profile name 'h200' is already defined by a.yaml",
        both(
            write("profiles/a.yaml", GOOD_PROFILE.format(name="h200")),
            write("profiles/b.yaml", GOOD_PROFILE.format(name="h200")),
        ),
    ),
    "profile-not-utf8": Case(
        lambda root: ["--profiles", str(root / "profiles")],
        "a.yaml (--profiles): not UTF-8 text (byte 0xff at offset 13)",
        write("profiles/a.yaml", b"version: v1\nn\xffame: x\n"),
    ),
    "profile-bad-yaml": Case(
        lambda root: ["--profiles", str(root / "profiles")],
        "a.yaml (--profiles): not valid YAML",
        write("profiles/a.yaml", "version: v1\nname: [unclosed\n"),
    ),
    "queue-bad-name": Case(
        lambda root: ["--queues", str(root / "queues.yaml")],
        "queues.yaml (--queues): queues[0]: queue name 'bad name!' must be",
        write("queues.yaml", "version: v1\nqueues:\n  - {name: 'bad name!'}\n"),
    ),
    "queues-not-utf8": Case(
        lambda root: ["--queues", str(root / "queues.yaml")],
        "queues.yaml (--queues): not UTF-8 text",
        write("queues.yaml", b"version: v1\nqueues:\n  - {name: caf\xe9}\n"),
    ),
    "queues-missing": Case(
        lambda root: ["--queues", str(root / "none.yaml")], "--queues {root}/none.yaml: no such"
    ),
    "rules-not-utf8": Case(
        lambda root: ["--rules", str(root / "rules.yaml")],
        "rules.yaml (--rules): not UTF-8 text",
        write("rules.yaml", b"version: v1\n\xfe\n"),
    ),
    "db-unsupported": Case(lambda _: ["--db", "mysql://kiln@127.0.0.1/kiln"], "--db mysql://"),
    "db-unreachable": Case(
        lambda _: ["--db", f"postgresql+psycopg://kiln@127.0.0.1:{free_port()}/kiln"],
        "cannot connect to the database: connection failed",
    ),
    "db-read-only": Case(
        lambda root: ["--db", f"sqlite:///file:{root}/ro/kiln.db?mode=ro&uri=true"],
        "the database does not take writes",
        read_only_sqlite,
    ),
    "state-dir-is-a-file": Case(
        lambda root: ["--state-dir", str(root / "state")],
        "--state-dir {root}/state: cannot create it",
        write("state", "not a directory"),
    ),
    "secret-key-not-a-key": Case(
        lambda root: ["--secret-key-file", str(root / "secret.key")],
        "--secret-key-file {root}/secret.key: does not hold a Fernet key",
        write("secret.key", "hunter2\n"),
    ),
}


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another program listens on."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def assert_refused(args: list[str], expected: str) -> None:
    done = run(args, timeout=60)
    assert done.code == 2, done
    assert len(done.lines) == 1, done.stderr
    assert done.lines[0].startswith("kiln-controller: error: "), done.stderr
    assert expected in done.lines[0], done.stderr
    assert "Traceback" not in done.stderr and "listening" not in done.stdout


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_bad_option_is_one_line_and_exit_2(case: Case, tmp_path: Path) -> None:
    case.setup(tmp_path)
    args = case.args(tmp_path)
    if "--state-dir" not in args:
        args += ["--state-dir", str(tmp_path / "state")]
    if "--listen" not in args:
        args += ["--listen", f"127.0.0.1:{free_port()}"]
    assert_refused(args, case.expected.format(root=tmp_path))


def test_a_port_held_by_another_program(held_port: int, tmp_path: Path) -> None:
    assert_refused(
        ["--listen", f"127.0.0.1:{held_port}", "--state-dir", str(tmp_path / "state")],
        f"--listen 127.0.0.1:{held_port}: address already in use",
    )


def test_a_read_only_postgresql_database(postgres_url: str, tmp_path: Path) -> None:
    # A replica, or a database set read-only: it answers, but refuses writes.
    read_only = postgres_url + "?options=-c%20default_transaction_read_only%3Don"
    assert_refused(
        ["--db", read_only, "--state-dir", str(tmp_path / "state")],
        "the database does not take writes (a read-only file or replica?): cannot execute "
        "CREATE TABLE in a read-only transaction",
    )
    engine = create_engine(postgres_url)
    with engine.connect() as conn:  # the probe left nothing behind
        probes = conn.execute(
            text("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'kiln_write_probe%'")
        ).scalar()
    engine.dispose()
    assert probes == 0


@pytest.mark.timeout(60)
async def test_the_bmc_options_reach_the_bmc_pool(tmp_path: Path) -> None:
    from controller.options import parse
    from controller.server import ControllerServer

    config = parse(
        [
            "--state-dir",
            str(tmp_path),
            "--listen",
            "127.0.0.1:0",
            "--bmc-call-timeout",
            "4",
            "--bmc-power-timeout",
            "50",
            "--bmc-power-resend-after",
            "7.5",
            "--bmc-workers",
            "16",
        ]
    ).config
    server = ControllerServer(config)
    await server.start()
    try:
        gateway = server._bmc
        pool = gateway._pool  # type: ignore[union-attr]
        assert (pool.call_timeout, pool.power_resend_after, pool._max_workers) == (4.0, 7.5, 16)
        assert gateway._power_timeout == 50.0  # type: ignore[union-attr]
    finally:
        await server.stop()
