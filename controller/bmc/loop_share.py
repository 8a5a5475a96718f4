"""How many BMC worker threads may run at once, from how late their results
reach the event loop.

sushy, requests and pyghmi run Python in the worker threads, and Python runs
one thread at a time. A thread waiting on a BMC's socket costs the event loop
nothing; a thread turning a refused connection or a large answer into
objects competes with it for the interpreter, and with hundreds of such
threads the loop (every API call, every agent report) gets its turn late.
Measured on 2 cores: 3,000 leak reads of BMCs that refuse connections, 256 at
once, left the loop 101 ms late at the median and 485 ms at p99; 32 at once,
1 ms and 115 ms, at the same CPU per read.

So the pool watches two things. A finished call's result is handed to the
loop, and the time until the loop takes it up is the loop's lateness; and
each call's thread CPU time (``time.thread_time``) says how much of the
interpreter the threads took. Each ``window`` seconds:

* the median lateness above ``slow_above`` while the threads used more than
  ``busy_cores`` of a core: the limit is divided by how many times too late
  the loop is (2 to 8 times; not below ``floor``). ``slow_above`` is 20 ms
  in the controller's own process, where the loop serves the agents and the
  API, and 250 ms in a BMC reader process (``--bmc-readers``), whose loop
  only hands calls out and results back. A loop late for other
  reasons, with threads that only wait on their BMCs, keeps its threads:
  holding them back would not help it;
* the median below ``fast_below``: the limit grows by an eighth (at least
  one), up to the pool's size.

It starts with every thread: the limit only moves on results, and calls to
BMCs that never answer bring none for seconds (pyghmi gives up after about
5 s), so a slow start would hold such calls back with nothing to go on.

Additive increase, multiplicative decrease, as TCP does with its window:
calls to BMCs that only wait keep the loop on time and keep every thread;
calls that burn the interpreter are held to what leaves the loop on time
(with one or two such threads the loop waits at most a switch interval or
two, 5 ms each, for its turn). A call over the limit waits in its lane,
within its own deadline (it fails ``BmcBusy`` as when every thread is
taken).
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field

LOG = logging.getLogger(__name__)

DEFAULT_FLOOR = 2  # threads that may always run, however late the loop
DEFAULT_WINDOW = 0.5  # s of results judged at a time
DEFAULT_SLOW_ABOVE = 0.02  # s: a median lateness that cuts the limit
FAST_SHARE = 0.25  # of slow_above: a median lateness under which it grows (5 ms)
# In a BMC reader process the loop only hands calls out and results back:
# a result 250 ms late costs nothing there, a thread held back costs reads.
READER_SLOW_ABOVE = 0.25
DEFAULT_BUSY_CORES = 0.25  # the threads' CPU (cores) over which they are the cause
MAX_CUT = 8  # the most a limit is divided by in one window


@dataclass
class LoopShare:
    """The running limit of one worker pool (module docstring).

    ``observe`` is called on the event loop's thread; ``limit`` is read by the
    worker threads under the pool's lock, and a changed limit is returned so
    the pool can wake its threads.
    """

    ceiling: int
    name: str = ""
    floor: int = DEFAULT_FLOOR
    window: float = DEFAULT_WINDOW
    slow_above: float = DEFAULT_SLOW_ABOVE
    fast_below: float = 0.0  # 0: a quarter of ``slow_above`` (5 ms by default)
    busy_cores: float = DEFAULT_BUSY_CORES
    limit: int = field(init=False)
    _seen: list[float] = field(init=False, default_factory=list)
    _judge_at: float = field(init=False, default=0.0)
    _cpu: float = field(init=False, default=0.0)  # the threads' CPU seconds this window

    def __post_init__(self) -> None:
        if self.ceiling < 1:
            raise ValueError("the pool needs at least one thread")
        self.floor = max(1, min(self.floor, self.ceiling))
        if not self.fast_below:
            self.fast_below = self.slow_above * FAST_SHARE
        if not 0 < self.fast_below < self.slow_above:
            raise ValueError("fast_below must be above 0 and below slow_above")
        self.limit = self.ceiling

    def spent(self, cpu_seconds: float) -> None:
        """A call's thread used ``cpu_seconds`` (called under the pool's lock)."""
        self._cpu += cpu_seconds

    def observe(self, late: float, now: float | None = None) -> bool:
        """Note how late one result reached the loop; True when the limit
        changed. Called on the loop's thread, under the pool's lock."""
        now = time.monotonic() if now is None else now
        self._seen.append(late)
        if not self._judge_at:
            self._judge_at = now + self.window
        if now < self._judge_at:
            return False
        median = statistics.median(self._seen)
        cores = self._cpu / (self.window + now - self._judge_at)
        self._seen.clear()
        self._cpu = 0.0
        self._judge_at = now + self.window
        before = self.limit
        if median > self.slow_above and cores > self.busy_cores:
            cut = min(MAX_CUT, max(2, int(median / self.slow_above)))
            self.limit = max(self.floor, self.limit // cut)
        elif median < self.fast_below:
            self.limit = min(self.ceiling, self.limit + max(1, self.limit // 8))
        if self.limit == before:
            return False
        if self.limit < before and before == self.ceiling:
            LOG.warning(
                "BMC %s calls: results reach the event loop %.0f ms late at the median, "
                "the threads using %.1f cores; at most %d of %d threads run at once until "
                "it keeps up",
                self.name,
                median * 1e3,
                cores,
                self.limit,
                self.ceiling,
            )
        elif self.limit == self.ceiling:
            LOG.info(
                "BMC %s calls: the event loop keeps up; all %d threads may run",
                self.name,
                self.ceiling,
            )
        return True
