"""How deep a JSON text nests, counted before it is parsed and without recursion.

``json.loads`` recurses once a nesting level. Text nested thousands deep from
outside (a BMC's answer, a fault given to the API) takes it to the
interpreter's recursion limit, and a garbage collection that runs there calls
other objects' finalizers with no stack left: they fail as "unraisable"
RecursionErrors far from the bad input. Callers refuse such text with
:func:`nests_deeper_than` before handing it to ``json.loads``.
"""

from __future__ import annotations

import operator
import re
from itertools import accumulate, count

# A string runs to its closing quote, or to the end when it has none, so the
# scan is linear even on text of unbalanced, escaped quotes.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]+")
_STEPS = str.maketrans({"[": "\x02", "{": "\x02", "]": "\x00", "}": "\x00"})


def nesting(text: str) -> int:
    """The deepest nesting of ``text``'s brackets, strings left out.

    The count runs in C (``accumulate`` over the brackets alone): an opening
    bracket steps +1 and a closing one -1, written as 2 and 0, so the depth
    after the i-th bracket is the running sum less i. 16 MiB of nothing but
    brackets is scanned in about a second on a slow core.
    """
    brackets = _NOT_A_BRACKET.sub("", _STRING.sub("", text))
    steps = brackets.translate(_STEPS).encode("latin-1")
    return max(0, max(map(operator.sub, accumulate(steps), count(1)), default=0))


def nests_deeper_than(text: str, limit: int) -> bool:
    """True when ``text`` nests more than ``limit`` levels (valid JSON or not).

    Text with no more than ``limit`` opening brackets cannot, and is answered
    without the scan: the common case, in microseconds.
    """
    if text.count("[") + text.count("{") <= limit:
        return False
    return nesting(text) > limit
