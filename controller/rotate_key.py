"""``kiln-controller rotate-key``: the command line around ``store.key_rotation``.

Takes the same ``--state-dir``, ``--db`` and ``--secret-key-file`` as the
controller, so it finds the database and key the controller would. Exit
status 0 when every password is sealed under the new key, 2 when it refused
(one line says why; nothing changed), 1 on an unexpected failure.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from controller.core.errors import KilnError
from controller.options import OptionError, check_db_url
from controller.store.engine import default_sqlite_url
from controller.store.key_rotation import rotate_key

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_REFUSED = 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kiln-controller rotate-key",
        description="Re-seal every stored BMC password under a new secret key. Stop every "
        "controller on the database first; afterwards the key file holds the new key and "
        "KEY.previous the old one (docs/operations.md).",
    )
    p.add_argument("--db", default=None, help="database URL; default SQLite in --state-dir")
    p.add_argument(
        "--state-dir", type=Path, default=Path("state"), help="as for the controller (./state)"
    )
    p.add_argument(
        "--secret-key-file",
        type=Path,
        default=None,
        help="the current key (default: secret.key in --state-dir); replaced by the new one",
    )
    p.add_argument(
        "--new-key-file",
        type=Path,
        default=None,
        help="rotate to the key in this file (default: a new random key)",
    )
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    key_file: Path = args.secret_key_file or args.state_dir / "secret.key"
    try:
        if args.db is not None:
            check_db_url(args.db)
            url = args.db
        elif not (args.state_dir / "kiln.db").exists():
            raise OptionError.value("--state-dir", args.state_dir, "holds no Kiln database")
        else:
            url = default_sqlite_url(args.state_dir)
        if args.new_key_file is not None and not args.new_key_file.is_file():
            raise OptionError.value("--new-key-file", args.new_key_file, "no such file")
        rotation = rotate_key(url, key_file, args.new_key_file)
    except KilnError as e:
        print(f"kiln-controller rotate-key: error: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except OSError as e:
        print(
            f"kiln-controller rotate-key: error: {e.strerror or e}: {e.filename}", file=sys.stderr
        )
        return EXIT_FAILED
    print(
        f"re-sealed {rotation.resealed} BMC password(s); {rotation.key_file} holds the new key, "
        f"{rotation.previous_file} the one it replaced"
    )
    return EXIT_OK


__all__ = ["build_parser", "main"]
