"""``kiln``'s argument parser: argparse, with errors a person can act on.

argparse names an option's type function in its error ("invalid _positive
value: 'abc'") and lists every choice of a mistyped command without a
guess. ``KilnParser`` says what was expected instead ("'abc' is not a
whole number") and suggests the closest command or choice ("did you mean
'nodes'?"). Sub-commands' parsers are made from the same class.
"""

from __future__ import annotations

import argparse
import difflib
from typing import Any

# What an option's type reads, by the type function's name; anything else is
# "a valid value" (the function's own ArgumentTypeError says more).
_EXPECTED = {
    "int": "a whole number",
    "float": "a number",
    "_positive": "a whole number",
    "_count": "a whole number",
    "_seq": "a whole number",
    "_days": "a whole number of days",
    "_seconds": "a number of seconds",
    "_timeout": "a number of seconds",
}


def did_you_mean(value: str, choices: Any) -> str:
    """``"; did you mean 'X'?"`` for the closest of ``choices``, else ""."""
    close = difflib.get_close_matches(value, [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class KilnParser(argparse.ArgumentParser):
    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as e:
            name = getattr(action.type, "__name__", "")
            if f"invalid {name} value" not in str(e):
                raise  # the type's own words (ArgumentTypeError), kept
            expected = _EXPECTED.get(name, "a valid value")
            raise argparse.ArgumentError(action, f"{arg_string!r} is not {expected}") from None

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            listed = ", ".join(str(c) for c in action.choices)
            hint = did_you_mean(str(value), action.choices)
            raise argparse.ArgumentError(action, f"unknown {value!r} (choose from {listed}){hint}")
