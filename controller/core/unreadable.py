"""One log line for the nodes that failed alike in one pass.

A BMC network down makes 25,000 BMCs unreadable at once; a line each would
bury everything else in the log. The watchers (leak detectors, silent
agents' thermal sensors) and the lifecycle collect the nodes that failed in
a pass and say them here: the node's own line when it is one, else how
many, the first one's error and the next few names.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

NAMED = 10  # names listed beside the first, in a line for many


def say_nodes(
    log: logging.Logger,
    level: int,
    found: Sequence[tuple[str, str]],
    *,
    one: str,
    many: str,
    stacklevel: int = 2,
) -> None:
    """Log the ``found`` nodes (node, error) in one line: ``one`` % (node,
    error) for a single node, else ``many`` % (how many, the first node, its
    error, the next few names). ``stacklevel``: the log record names the
    caller's line, as ``logging`` counts it."""
    if not found:
        return
    name, error = found[0]
    if len(found) == 1:
        log.log(level, one, name, error, stacklevel=stacklevel)
        return
    others = ", ".join(n for n, _ in found[1 : NAMED + 1])
    if len(found) > NAMED + 1:
        others += ", ..."
    log.log(level, many, len(found), name, error, others, stacklevel=stacklevel)


def say_unreadable(
    log: logging.Logger, what: str, found: Sequence[tuple[str, str]], then: str
) -> None:
    """Log that ``what`` (e.g. "leak detectors") of the ``found`` nodes
    (node, error) became unreadable; ``then`` says what happens next."""
    say_nodes(
        log,
        logging.INFO,
        found,
        one=f"node %s: {what} unreadable: %s ({then})",
        many=f"{what} of %d nodes newly unreadable ({then}); node %s: %s; also %s",
        stacklevel=3,
    )
