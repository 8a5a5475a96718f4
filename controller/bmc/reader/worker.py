"""A BMC reader: a process that does the controller's periodic BMC reads.

It owns a BMC pool like the controller's (``BmcPool``: threads per
protocol, per-BMC call slots, retries and breakers) and reads what the
controller asks (``wire.py``), answering each call as it finishes. It keeps
nothing but the pool's handles and exits when its link to the controller
ends.

    python -m controller.bmc.reader.worker --link-fd FD [--workers N]
        [--call-timeout S] [--verbose]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import uvloop

from controller import heap
from controller.bmc.gateway import PoolGateway
from controller.bmc.loop_share import READER_SLOW_ABOVE
from controller.bmc.pool import BmcPool
from controller.bmc.reader import wire
from controller.link import FrameError, encode, open_link, read_frame

log = logging.getLogger("kiln.bmc_reader")

# Its reads are background work: on a host whose cores are all busy, the
# controller's event loop (agents, API calls) goes first. In the controller's
# own process the BMC threads yield to the loop (``loop_share``); a reader
# yields to the controller through the kernel's scheduler instead.
NICENESS = 10

Send = Callable[[tuple[Any, ...]], None]


async def answer(gateway: PoolGateway, frame: tuple[Any, ...], send: Send) -> None:
    """Do one call and send its DONE or ERROR frame."""
    tag, call = frame[0], frame[1]
    value: Any
    try:
        if tag == wire.POWER:
            targets = [wire.target_from(t) for t in frame[2]]
            value = await gateway.poll_power(targets, frame[3], spread=frame[4])
        elif tag == wire.LEAKS:
            readings = await gateway.leak_detectors(wire.target_from(frame[2]))
            value = [wire.leak_tuple(r) for r in readings]
        elif tag == wire.THERMAL:
            value = await gateway.thermal_c(wire.target_from(frame[2]))
        else:
            raise FrameError(f"unknown call {tag!r}")
    except asyncio.CancelledError:
        raise
    except Exception as e:
        if not isinstance(e, wire.KilnError):
            log.exception("BMC reader: call %d failed", call)
        send(wire.error_frame(call, e))
        return
    send((wire.DONE, call, value))


async def serve(args: argparse.Namespace) -> int:
    # A reader's heap is its BMC handles, one per node it reads (750,000
    # objects at 25,000 nodes): with CPython's collector settings each
    # whole-heap collection walked them (about 250 ms), 17 % of its CPU a
    # read (bench: 0.50 ms a read, 0.42 with these). Set as the controller's.
    # The handles are made as nodes are read: refrozen after a long collection.
    pauses = heap.settle_worker("the BMC reader")
    try:
        return await _serve(args)
    finally:
        pauses.stop()


async def _serve(args: argparse.Namespace) -> int:
    reader, writer = await open_link(args.link_fd)
    pool = BmcPool(
        max_workers=args.workers, call_timeout=args.call_timeout, slow_above=READER_SLOW_ABOVE
    )
    gateway = PoolGateway(pool)

    def send(frame: tuple[Any, ...]) -> None:
        if not writer.is_closing():
            writer.write(encode(frame))

    calls: set[asyncio.Task[None]] = set()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, writer.close)
    send((wire.READY,))
    try:
        while True:
            frame = await read_frame(reader)
            if frame is None:
                break
            if frame[0] == wire.FORGET:
                gateway.forget(frame[1])
                continue
            task = asyncio.create_task(answer(gateway, frame, send))
            calls.add(task)
            task.add_done_callback(calls.discard)
    except FrameError:
        log.exception("BMC reader: the link to the controller failed")
    except ConnectionError as e:  # the controller closed its end first (the relay worker's note)
        log.info("BMC reader: the controller closed the link (%s); stopping", e)
    finally:
        for task in calls:
            task.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        await gateway.close()
        writer.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--link-fd", type=int, required=True)
    parser.add_argument("--workers", type=int, default=256)
    parser.add_argument("--call-timeout", type=float, default=10.0)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        # As the controller's lines, saying which process logged them.
        format="%(asctime)s %(levelname)s %(name)s (BMC reader %(process)d): %(message)s",
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the controller's Ctrl-C is for it to handle
    os.nice(NICENESS)
    # uvloop (libuv): a reader's loop does little but connect, write and
    # read sockets, which cost about a third less CPU there (a power read
    # 0.14 ms against 0.20 on asyncio's own loop, bench/bmc_read_cost.py).
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
