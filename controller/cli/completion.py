"""``kiln completion bash|zsh``: a shell completion script for ``kiln``.

The script is generated from the CLI's own parser, so it offers exactly the
commands, sub-commands and options this ``kiln`` has. Install with
``kiln completion bash > /etc/bash_completion.d/kiln`` (or
``source <(kiln completion bash)`` in ``~/.bashrc``); zsh:
``kiln completion zsh > "${fpath[1]}/_kiln"`` or ``source <(kiln completion zsh)``.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from controller.cli.output import emit

SHELLS = ("bash", "zsh")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("completion", help="print a shell completion script (bash/zsh)")
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    p.set_defaults(func=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    from controller.cli.main import build_parser

    emit(script(build_parser(), args.shell))
    return 0


def tree(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> dict[tuple[str, ...], list[str]]:
    """Each command path → the words that may follow it (sub-commands, then options)."""
    words: list[str] = []
    found: dict[tuple[str, ...], list[str]] = {path: words}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                words.append(name)
                found.update(tree(child, (*path, name)))
        elif action.option_strings and action.help != argparse.SUPPRESS:
            words.extend(o for o in action.option_strings if o.startswith("--"))
        elif not action.option_strings and action.choices:
            words.extend(str(c) for c in action.choices)
    return found


def valued_options(parser: argparse.ArgumentParser) -> set[str]:
    """Options that take a value (the word after them is not a command)."""
    found: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found |= valued_options(child)
        elif action.option_strings and action.nargs != 0:
            found.update(action.option_strings)
    return found


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    cases = "\n".join(
        f"    {shlex.quote(' '.join(path))}) words={shlex.quote(' '.join(words))} ;;"
        for path, words in sorted(tree(parser).items())
    )
    valued = "|".join(sorted(valued_options(parser))) or "--"
    body = f"""_kiln() {{
  local cur="${{COMP_WORDS[COMP_CWORD]}}" path="" skip=0 w words=""
  for w in "${{COMP_WORDS[@]:1:COMP_CWORD-1}}"; do
    if [ "$skip" = 1 ]; then skip=0; continue; fi
    case "$w" in
      {valued}) skip=1 ;;
      -*) ;;
      *) path="${{path:+$path }}$w" ;;
    esac
  done
  case "$path" in
{cases}
  esac
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -F _kiln kiln"""
    if shell == "zsh":
        return f"#compdef kiln\nautoload -U +X bashcompinit && bashcompinit\n{body}"
    return f"# bash completion for kiln (kiln completion bash)\n{body}"
