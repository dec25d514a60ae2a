"""One vocabulary of options: README.md's table is serving/cli_options.VOCABULARY, no ``--help`` shows an old
spelling, and every old spelling is still accepted by the commands that had it."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from serving.cli import build_parser
from serving.cli_options import VOCABULARY, vocabulary_table

README = Path(__file__).resolve().parents[1] / "README.md"
COMMANDS = ("convert", "verify", "translate", "serve", "batch-score", "loadtest", "validate", "sweep", "export-triton")
OLD = ("--runtime", "--max-batch-sentences", "--max-batch-delay-ms", "--queue-capacity", "--max-tokens", "--candidate")


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser(only=command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = sub.choices[command]
    assert isinstance(found, argparse.ArgumentParser)
    return found


def test_readme_table_is_the_vocabulary() -> None:
    match = re.search(r"<!-- options-table[^\n]*-->\n(.*?)<!-- /options-table -->", README.read_text(encoding="utf-8"),
                      re.DOTALL)
    assert match is not None, "README.md lost its <!-- options-table --> markers"
    assert match.group(1) == vocabulary_table()
    assert {t.option for t in VOCABULARY} >= {"-m, --model PKG", "--backend NAME", "--max-batch-size N"}


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_only_the_vocabulary(command: str) -> None:
    text = _subparser(command).format_help()
    shown = set(re.findall(r"--[a-z][a-z0-9-]*", text))
    assert not shown & set(OLD), f"mtgate {command} --help shows old spellings: {sorted(shown & set(OLD))}"
    assert "--log-level" in shown
    parser = _subparser(command)
    for action in parser._actions:
        if action.option_strings and action.help != argparse.SUPPRESS and action.dest != "help":
            assert action.help, f"mtgate {command}: {action.option_strings} has no help text"


@pytest.mark.parametrize(("command", "old", "new", "value", "expected"), [
    ("serve", "--max-batch-sentences", "max_batch_size", "7", 7),
    ("serve", "--max-batch-delay-ms", "max_queue_delay_us", "5", 5000),
    ("serve", "--queue-capacity", "max_queue_size", "9", 9),
    ("translate", "--runtime", "backend", "openvino", "openvino"),
    ("batch-score", "--runtime", "backend", "openvino", "openvino"),
    ("batch-score", "--max-tokens", "max_batch_tokens", "99", 99),
    ("export-triton", "--runtime", "backend", "openvino", "openvino"),
    ("validate", "--runtime", "backend", "openvino", "openvino"),
])
def test_old_spellings_still_parse(command: str, old: str, new: str, value: str, expected: object) -> None:
    required = {"batch-score": ["in.txt"], "export-triton": ["-o", "repo"], "validate": []}.get(command, [])
    args = _subparser(command).parse_args([*required, old, value])
    assert getattr(args, new) == expected
