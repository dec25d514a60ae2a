"""One vocabulary of options, read from every command's parser: README.md's table is serving/commands/vocabulary.VOCABULARY,
no ``--help`` shows an old spelling, every old spelling is still accepted (a deprecated one with one warning line),
one name and one kind of value per concept across commands (plural where a command takes several), the same
default for the same option (unless this file says why not), every package-reading command takes ``-m PKG``, no
option a command needs is shown as optional, and ``--precision`` defaults to ``auto`` everywhere."""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import pytest

from serving.commands.main import build_parser, main
from serving.commands.vocabulary import VOCABULARY, vocabulary_table
from serving.package.precision import INT8_MAX_BLEU_DROP, PRECISION_CHOICES

README = Path(__file__).resolve().parents[1] / "README.md"
COMMANDS = ("convert", "verify", "translate", "score", "serve", "batch-score", "loadtest", "validate", "sweep",
            "export-triton")
OLD = ("--backend", "--max-batch-sentences", "--max-batch-delay-ms", "--queue-capacity", "--max-tokens", "--candidate",
       "--batch-size", "--baseline-backend")
"""Old spellings no command may show (besides each command's own in VOCABULARY)."""

READS_NO_PACKAGE = {"convert": "writes a package (-o DIR) from a checkpoint SRC",
                    "sweep": "its sweep file names the models"}
DEFAULTS_DIFFER = {
    ("--max-queue-size", "export-triton"): "Triton's own default, 0 (unbounded): Triton's queue counts requests where "
                                           "serve's counts sentences",
    ("--max-batch-size", "batch-score"): "offline (serving.server.settings.OFFLINE_MAX_BATCH_SIZE): no record waits for a "
                                         "batch, and bigger ones give more tokens/s",
    ("--max-batch-tokens", "batch-score"): "offline (serving.server.settings.OFFLINE_MAX_BATCH_TOKENS): every worker (one per "
                                           "core) holds a batch",
    ("--threads", "batch-score"): "batch-score splits the cores between its workers",
    ("--workers", "serve"): "serve runs one process (scale it with replicas), batch-score one per core",
    ("--output", "*"): "each command writes its own kind of result",
}
"""(option, command) whose default differs from the other commands' on purpose, and why (each help text says it)."""
KIND_DIFFERS = {
    "-o": "a package directory, a file or a repository: each command writes its own kind of result",
    "--output": "a package directory, a file or a repository: each command writes its own kind of result",
}
"""Options whose value is of a different kind (metavar) in different commands, and why."""
RUN_WITH_EVERY_DEFAULT = {"serve": "would start serving the demo model", "translate": "would read stdin"}
"""Commands that need no argument at all, not run by test_nothing_needed_is_shown_optional."""


@dataclass(frozen=True)
class Option:
    """One option of one command's parser, as ``--help`` shows it."""

    command: str
    flags: tuple[str, ...]
    dest: str
    metavar: str
    default: Any
    required: bool
    shown: bool
    help: str

    @property
    def name(self) -> str:
        """The long flag (``--model`` of ``-m/--model``)."""
        return next((f for f in self.flags if f.startswith("--")), self.flags[0])


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser(only=command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = sub.choices[command]
    assert isinstance(found, argparse.ArgumentParser)
    return found


def _serve_default(dest: str, default: Any) -> Any:
    """serve's options default to None and its settings decide: the settings' default is the option's."""
    from serving.commands import serve as serve_cli
    from serving.server.settings import ServingSettings

    field = serve_cli._SETTINGS_FLAGS.get(dest)
    return ServingSettings.model_fields[field].default if default is None and field else default


def _options(command: str) -> list[Option]:
    found = []
    for action in _subparser(command)._actions:
        if not action.option_strings or action.dest in ("help", "log_level"):
            continue
        if action.metavar is not None:
            metavar = str(action.metavar)
        elif action.choices is not None:
            metavar = "{" + ",".join(map(str, action.choices)) + "}"
        else:
            metavar = "" if action.nargs == 0 else action.dest.upper()
        default = _serve_default(action.dest, action.default) if command == "serve" else action.default
        found.append(Option(command, tuple(action.option_strings), action.dest, metavar, default, action.required,
                            action.help != argparse.SUPPRESS, str(action.help or "")))
    return found


@pytest.fixture(scope="module")
def every_option(monkeypatch_module: pytest.MonkeyPatch) -> list[Option]:
    return [option for command in COMMANDS for option in _options(command)]


@pytest.fixture(scope="module")
def monkeypatch_module() -> Any:
    # batch-score's --api-key defaults to $MTGATE_API_KEY when the parser is built
    with pytest.MonkeyPatch.context() as patch:
        for name in ("MTGATE_API_KEY", "MTGATE_LOADTEST_API_KEY"):
            patch.delenv(name, raising=False)
        yield patch


def _old_spellings(command: str) -> dict[str, Any]:
    """Old spelling -> its Alias, for ``command`` (VOCABULARY's aliases of every command, and this command's)."""
    return {a.spelling: a for term in VOCABULARY for a in term.aliases if not a.commands or command in a.commands}


def test_readme_table_is_the_vocabulary() -> None:
    match = re.search(r"<!-- options-table[^\n]*-->\n(.*?)<!-- /options-table -->", README.read_text(encoding="utf-8"),
                      re.DOTALL)
    assert match is not None, "README.md lost its <!-- options-table --> markers"
    assert match.group(1) == vocabulary_table()
    assert {t.option for t in VOCABULARY} >= {"-m, --model PKG", "--runtime NAME", "--max-batch-size N",
                                              "--host ADDR", "--server URL"}


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
    old = _old_spellings(command)
    for option in _options(command):
        flags = set(option.flags)
        if option.shown:
            assert not flags & set(old), f"mtgate {command} shows {option.flags}, an old spelling (VOCABULARY)"
        else:
            assert flags <= set(old), f"mtgate {command} hides {option.flags}, which VOCABULARY does not list"


@pytest.mark.parametrize(("command", "old", "new", "value", "expected"), [
    ("serve", "--max-batch-sentences", "max_batch_size", "7", 7),
    ("serve", "--max-batch-delay-ms", "max_queue_delay_us", "5", 5000),
    ("serve", "--queue-capacity", "max_queue_size", "9", 9),
    ("serve", "--backend", "runtime", "openvino", "openvino"),
    ("translate", "--backend", "runtime", "openvino", "openvino"),
    ("score", "--backend", "runtime", "openvino", "openvino"),
    ("batch-score", "--backend", "runtime", "openvino", "openvino"),
    ("batch-score", "--max-tokens", "max_batch_tokens", "99", 99),
    ("batch-score", "--max-batch-sentences", "max_batch_size", "5", 5),
    ("export-triton", "--backend", "runtime", "openvino", "openvino"),
    ("validate", "--backend", "runtime", "openvino", "openvino"),
    ("validate", "--baseline-backend", "baseline_runtime", "openvino", "openvino"),
    ("validate", "--batch-size", "max_batch_size", "8", 8),
    ("validate", "--candidate", "model", "pkg", Path("pkg")),
    ("convert", "--precision", "precisions", "fp32,int8", ["fp32", "int8"]),
    ("verify", "--source", "checkpoint", "ckpt", Path("ckpt")),
    ("loadtest", "--host", "server", "http://127.0.0.1:1", "http://127.0.0.1:1"),
])
def test_old_spellings_still_parse(command: str, old: str, new: str, value: str, expected: object,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    required = {"batch-score": ["in.txt"], "export-triton": ["-o", "repo"], "validate": [] if old == "--candidate"
                else ["-m", "pkg"], "convert": ["src", "-o", "out"], "score": ["--source", "s", "--target", "t"],
                "loadtest": []}.get(command, [])
    args = _subparser(command).parse_args([*required, old, value])
    assert getattr(args, new) == expected
    warned = capsys.readouterr().err.splitlines()
    if _old_spellings(command)[old].deprecated:
        assert len(warned) == 1 and f"mtgate {command}: warning: {old} is deprecated, use " in warned[0], warned
    else:  # a synonym that stays (loadtest's --host: Locust's name for the URL)
        assert warned == []


def test_one_kind_of_value_per_option(every_option: list[Option]) -> None:
    """The same flag takes the same kind of value everywhere: serve's --host is an address, so loadtest's URL is
    --server (as batch-score's); verify's checkpoint is --checkpoint (score's --source is sentences)."""
    kinds: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for option in every_option:
        if option.shown:
            for flag in option.flags:
                kinds[flag][option.metavar].append(option.command)
    mixed = {flag: dict(found) for flag, found in kinds.items() if len(found) > 1 and flag not in KIND_DIFFERS}
    assert mixed == {}, f"one flag, several kinds of value: {mixed}"
    for term in VOCABULARY:  # and the kind VOCABULARY says, where it names one
        words = term.option.split()
        kind = words[-1] if len(words) > 1 and not words[-1].startswith("-") and term.option.count("--") == 1 else None
        for option in every_option:
            if kind and option.shown and term.flags[-1] in option.flags and not option.metavar.startswith("{"):
                assert option.metavar == kind or term.flags[-1] in KIND_DIFFERS, (
                    f"mtgate {option.command} {term.flags[-1]} {option.metavar}: VOCABULARY says {term.option}")


def test_one_name_per_concept(every_option: list[Option]) -> None:
    """A destination (what the option sets) has one spelling across commands, and an option that takes several
    values (comma-separated) is the plural of the vocabulary's name: convert --runtimes A,B --precisions A,B."""
    names: dict[str, set[str]] = defaultdict(set)
    for option in every_option:
        if option.shown:
            names[option.dest].add(option.name)
    assert {dest: found for dest, found in names.items() if len(found) > 1} == {}
    singular = {flag for term in VOCABULARY for flag in term.flags}
    for option in every_option:
        takes_several = "comma-separated" in option.help
        if option.shown and takes_several:
            assert option.name.endswith("s") and option.name[:-1] in singular, (
                f"mtgate {option.command} {option.name} takes several values: spell it as a plural of VOCABULARY's")
        if option.shown and option.name in singular:
            assert not takes_several, f"mtgate {option.command} {option.name} takes several values: {option.name}s"


def test_same_option_same_default(every_option: list[Option]) -> None:
    defaults: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for option in every_option:
        documented = (option.name, option.command) in DEFAULTS_DIFFER or (option.name, "*") in DEFAULTS_DIFFER
        if option.shown and not option.required and not documented:
            defaults[option.name][repr(option.default)].append(option.command)
    differ = {flag: dict(found) for flag, found in defaults.items() if len(found) > 1}
    assert differ == {}, f"the same option defaults differently in different commands: {differ}"
    from serving.server.settings import (
        DEFAULT_MAX_BATCH_SIZE,
        DEFAULT_MAX_BATCH_TOKENS,
        OFFLINE_MAX_BATCH_SIZE,
        OFFLINE_MAX_BATCH_TOKENS,
    )

    by_name = {(o.command, o.name): o.default for o in every_option}
    for command in ("serve", "validate", "export-triton"):
        assert by_name[(command, "--max-batch-size")] == DEFAULT_MAX_BATCH_SIZE
    assert by_name[("serve", "--max-batch-tokens")] == DEFAULT_MAX_BATCH_TOKENS
    assert (by_name[("batch-score", "--max-batch-size")], by_name[("batch-score", "--max-batch-tokens")]) == (
        OFFLINE_MAX_BATCH_SIZE, OFFLINE_MAX_BATCH_TOKENS)


def test_precision_defaults_to_auto(every_option: list[Option]) -> None:
    from loadtest.sweep.config import Space
    from serving.server.settings import ServingSettings

    precision = [o for o in every_option if o.name == "--precision" and o.command != "convert"]
    assert {o.command for o in precision} == {"translate", "score", "serve", "batch-score", "validate",
                                              "export-triton"}
    assert {o.command: o.default for o in precision} == dict.fromkeys((o.command for o in precision), "auto")
    assert ServingSettings.model_fields["precision"].default == "auto"
    assert Space().precision == ["auto"]
    # one list of choices and one bound, however each place spells them
    assert get_args(ServingSettings.model_fields["precision"].annotation) == PRECISION_CHOICES
    assert {o.metavar for o in precision} == {"{" + ",".join(PRECISION_CHOICES) + "}"}
    term = next(t for t in VOCABULARY if t.flags == ("--precision",))
    assert f"costs at most {INT8_MAX_BLEU_DROP:g} BLEU" in term.meaning
    assert f"costs at most {INT8_MAX_BLEU_DROP:g} BLEU" in (ServingSettings.__doc__ or "")


def test_every_command_that_reads_a_package_takes_m() -> None:
    for command in COMMANDS:
        flags = {flag for option in _options(command) if option.shown for flag in option.flags}
        if command in READS_NO_PACKAGE:
            assert "-m" not in flags, f"mtgate {command}: {READS_NO_PACKAGE[command]}"
        else:
            assert {"-m", "--model"} <= flags, f"mtgate {command} reads a package but has no -m/--model PKG"


@pytest.mark.parametrize("command", [c for c in COMMANDS if c not in RUN_WITH_EVERY_DEFAULT])
def test_nothing_needed_is_shown_optional(command: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Run with only what the usage line shows as required: the refusal may not ask for an option the usage line
    shows in brackets (an option a command needs is shown without them, or as a required choice ``(A | B)``)."""
    parser = _subparser(command)
    missing = tmp_path / "missing"
    argv = [command]
    for action in parser._actions:
        if action.required and action.option_strings:
            argv += [action.option_strings[0], str(missing)]
    for action in parser._actions:
        if not action.option_strings and action.nargs not in ("?", "*", argparse.SUPPRESS, argparse.PARSER):
            argv.append(str(missing))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    usage = re.sub(r"\s+", " ", parser.format_usage())
    optional = set(re.findall(r"\[(--?[a-z][a-z0-9-]*)", usage))
    asked = set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", err))
    assert not asked & optional, f"mtgate {command} needs {sorted(asked & optional)}, shown optional: {usage}; {err}"


def test_run_with_every_default_needs_nothing() -> None:
    for command in RUN_WITH_EVERY_DEFAULT:
        parser = _subparser(command)
        assert [a.dest for a in parser._actions if a.required and a.nargs != "*"] == [], command
        assert not parser._mutually_exclusive_groups or not any(g.required for g in parser._mutually_exclusive_groups)


RUNTIME_LIST = re.compile(r"""[\[(]\s*["'](onnxruntime|openvino)["']\s*,\s*["'](onnxruntime|openvino)["']\s*[\])]""")
"""The two runtimes as a list, tuple or Literal of their own (not among other names, e.g. of PyPI packages)."""


def test_the_runtime_list_is_spelled_once() -> None:
    """``serving.package.Runtime`` is the one list of runtimes (``RUNTIMES`` its values, ``DEFAULT_RUNTIME``): every
    option, setting and default takes it from there, so a new runtime is one line."""
    root = README.parent
    places = [f"{path.relative_to(root)}:{number}"
              for folder in ("serving", "converters", "batch", "loadtest", "benchmarks")
              for path in sorted((root / folder).rglob("*.py"))
              for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
              if RUNTIME_LIST.search(line)]
    assert places == ["serving/package/manifest.py:15"], places
