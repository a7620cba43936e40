"""The command-line reference, written from the parser ``python -m recipes`` runs: every command with its usage, its
arguments and their help, so that the page cannot say what the parser no longer does."""

from __future__ import annotations

import argparse
from collections.abc import Iterator


def commands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """Each sub-command: its name, its one-line help and its parser, in the order ``--help`` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, command in action.choices.items():
                yield name, helps.get(name, ""), command


def argument_rows(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, str]]:
    """Each argument of a command but ``--help``: how it is written, its default, what it does."""
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
        if action.option_strings:
            takes_value = action.nargs != 0
            spelled = ", ".join(f"{option} {metavar}" if takes_value else option for option in action.option_strings)
        else:
            spelled = f"{metavar} ..." if action.nargs in ("*", "+") else str(metavar)
        default = action.default
        shown = "" if default in (None, [], argparse.SUPPRESS) or action.nargs == 0 else f"`{default}`"
        if action.required and action.option_strings:
            shown = "required"
        yield spelled, shown, action.help or ""


def usage(parser: argparse.ArgumentParser) -> str:
    return " ".join(parser.format_usage().split()).removeprefix("usage: ")


def render_cli(parser: argparse.ArgumentParser, intro: str) -> str:
    """The page: ``intro`` (what the parser cannot say), then a section per command."""
    lines = ["# Command-line reference", "", intro.strip(), "", "```", usage(parser), "```", ""]
    for name, summary, command in commands(parser):
        lines += [f"## `{name}`", "", summary[:1].upper() + summary[1:] + ".", "", "```", usage(command), "```", ""]
        rows = list(argument_rows(command))
        if rows:
            lines += ["| argument | default | meaning |", "| --- | --- | --- |"]
            lines += [f"| `{_cell(spelled)}` | {default} | {_cell(meaning)} |" for spelled, default, meaning in rows]
            lines.append("")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
