"""``kiln-controller``: run Kiln's central service
(``kiln-controller rotate-key``: re-seal the stored BMC passwords, see
``controller/rotate_key.py``).

Exit status, for the supervisor (``docs/operations.md``):

- 0: stopped by SIGTERM or SIGINT;
- 1: an unexpected error;
- 2: refused to start: an option, a file it names, the database, the secret
  key or the address is unusable; one line says which and why, and nothing
  was served;
- 3: stood down: the database went away (the active controller's lock with
  it, or a standby's wait); restart it, and it comes back as a standby or as
  the active controller once the database is there.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from controller import heap
from controller.core.errors import KilnError
from controller.options import build_parser, check_store, parse
from controller.server import ControllerConfig, ControllerServer, ListenError
from controller.store.active_lock import DatabaseLost, is_database_error

__all__ = ["build_parser", "main", "serve"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_REFUSED = 2
EXIT_STOOD_DOWN = 3


class _QuietDatabaseLoss(logging.Filter):
    """Drops the tracebacks of database errors once the database is known gone.

    Then every task that touches it (the lifecycle, the policies, power sync,
    each API call) fails with the same fault, one traceback each; the one line
    the controller stands down with says it instead.
    """

    def __init__(self, server: ControllerServer) -> None:
        super().__init__()
        self._server = server

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else getattr(record, "database_error", None)
        return not (
            error is not None and self._server.database_troubled and is_database_error(error)
        )


async def serve(config: ControllerConfig) -> int:
    """Run until SIGINT/SIGTERM (EXIT_OK).

    Raises ListenError when the address cannot be bound, DatabaseLost when
    the database goes away (the server has been stopped by then).
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = ControllerServer(config)
    loop.add_signal_handler(signal.SIGHUP, server.reload_tls)
    quiet = _QuietDatabaseLoss(server)
    handlers = list(logging.getLogger().handlers)
    for handler in handlers:
        handler.addFilter(quiet)
    starting = asyncio.create_task(server.start())
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # stopped while waiting as a standby
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            return EXIT_OK
        starting.result()
        heap.settle()  # the fleet is loaded: out of the collector's sight
        server.gc_pauses.refreeze_after = heap.REFREEZE_AFTER  # and what it grows into
        print(f"kiln-controller listening on {server.address}", flush=True)
        lost = asyncio.create_task(server.lock_lost.wait())
        await asyncio.wait({stopping, lost}, return_when=asyncio.FIRST_COMPLETED)
        lost.cancel()
        if server.lock_lost.is_set():
            raise DatabaseLost(reason=server.stand_down_reason)
        return EXIT_OK
    finally:
        stopping.cancel()
        await server.stop()
        for handler in handlers:
            handler.removeFilter(quiet)


def _fail(message: str | Exception, code: int) -> int:
    text = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    print(f"kiln-controller: error: {text}", file=sys.stderr, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["rotate-key"]:
        from controller import rotate_key

        return rotate_key.main(argv[1:])
    try:
        options = parse(argv)
    except KilnError as e:  # an option or a file it names; nothing opened yet
        return _fail(e, EXIT_REFUSED)
    logging.basicConfig(
        level=logging.DEBUG if options.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        check_store(options.config)
    except KilnError as e:
        return _fail(e, EXIT_REFUSED)
    try:
        return asyncio.run(serve(options.config))
    except ListenError as e:
        return _fail(f"--listen {e.fields['address']}: {e.fields['reason']}", EXIT_REFUSED)
    except DatabaseLost as e:
        return _fail(f"stood down: {e}", EXIT_STOOD_DOWN)
    except (KilnError, OSError) as e:
        return _fail(e, EXIT_FAILED)


if __name__ == "__main__":
    sys.exit(main())
