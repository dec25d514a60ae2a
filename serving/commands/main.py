"""The ``mtgate`` command. Each subcommand lives in its own module with ``add_arguments(parser)`` and ``run(args)``;
``serving.commands.registry`` says which commands there are (the serving install's own, and those ``converters``,
``batch`` and ``loadtest`` register as entry points).

Modules are imported lazily so that, for example, ``mtgate translate`` never imports the converters (or torch), and
the registered commands are looked up only when the command asked for is not the serving install's own.
A command outside the plain install (which serves) needs its extra; without it, the command answers with one line
naming the extra to install. Exit codes: 0 success, 1 a gate or check failed, 2 usage or input error.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from serving.commands.options import OneLineParser, UsageError, add_log_level
from serving.commands.registry import SERVING_COMMANDS, Command, all_commands, missing_extra

__all__ = ["UsageError", "build_parser", "main", "missing_extra"]

def build_parser(only: str | None = None, commands: Sequence[Command] | None = None) -> argparse.ArgumentParser:
    """The ``mtgate`` parser: every command listed, the options of ``only`` (its module imported) added."""
    parser = OneLineParser(prog="mtgate", description="Serve and validate translation Transformers on CPU.")
    level_help = "logging level, before or after the subcommand (default: WARNING; for serve, $MTGATE_LOG_LEVEL)"
    add_log_level(parser, default=None, help=level_help)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in all_commands() if commands is None else commands:
        sub_parser = sub.add_parser(command.name, help=command.help, description=command.help)
        add_log_level(sub_parser, help=level_help)
        if command.name == only:  # the command's own options (`mtgate --help` lists the commands only)
            module = importlib.import_module(command.module)
            module.add_arguments(sub_parser)
    return parser


def _asked(args: Sequence[str]) -> tuple[Command | None, list[Command] | None]:
    """The command named in ``args`` (its first word that is neither an option nor ``--log-level``'s value; None:
    none) and the commands to list (None: all): a serving command is found without looking up the registered ones."""
    words = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] != "--log-level")]
    own = {command.name: command for command in SERVING_COMMANDS}
    if words and words[0] in own:
        return own[words[0]], list(SERVING_COMMANDS)
    commands = all_commands()
    by_name = {command.name: command for command in commands}
    return (by_name.get(words[0]) if words else None), commands


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    command, commands = _asked(args_list)
    missing = missing_extra(command.extra) if command is not None and command.extra is not None else None
    if missing is not None:
        sys.stderr.write(f"mtgate {command.name}: error: {missing}\n")  # type: ignore[union-attr]
        return 2
    try:
        parser = build_parser(only=command.name if command else None, commands=commands)
    except ModuleNotFoundError as e:
        sys.stderr.write(f"mtgate: {command.name if command else ''}: not available in this install ({e})\n")
        return 2
    try:
        args = parser.parse_args(args_list)
    except SystemExit as e:
        return int(e.code or 0)
    if args.command is None:
        parser.print_help()
        return 2
    logging.basicConfig(level=(args.log_level or "WARNING").upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    assert command is not None and command.name == args.command
    module = importlib.import_module(command.module)
    try:
        return int(module.run(args))
    except UsageError as e:
        sys.stderr.write(f"mtgate {args.command}: error: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("mtgate: interrupted\n")
        return 130


if __name__ == "__main__":
    # Run the imported module's main so that UsageError is the class the subcommands raise, not __main__'s copy.
    from serving.commands.main import main as _main

    sys.exit(_main())
