"""One log line for the nodes whose BMC readings became unreadable.

A BMC network down makes 25,000 BMCs unreadable at once; a line each would
bury everything else in the log. The watchers (leak detectors, silent
agents' thermal sensors) collect the nodes that turned unreadable in a pass
and say them here: the node's own line when it is one, else how many, the
first one's error and the next few names.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

NAMED = 10  # names listed beside the first, in a line for many


def say_unreadable(
    log: logging.Logger, what: str, found: Sequence[tuple[str, str]], then: str
) -> None:
    """Log that ``what`` (e.g. "leak detectors") of the ``found`` nodes
    (node, error) became unreadable; ``then`` says what happens next."""
    if not found:
        return
    name, error = found[0]
    if len(found) == 1:
        log.info("node %s: %s unreadable: %s (%s)", name, what, error, then)
        return
    others = ", ".join(n for n, _ in found[1 : NAMED + 1])
    if len(found) > NAMED + 1:
        others += ", ..."
    log.info(
        "%s of %d nodes newly unreadable (%s); node %s: %s; also %s",
        what,
        len(found),
        then,
        name,
        error,
        others,
    )
