"""The ``mtgate`` command. Each subcommand lives in its own module with ``add_arguments(parser)`` and ``run(args)``.

Modules are imported lazily so that, for example, ``mtgate translate`` never imports the converters (or torch).
A command outside the plain install (which serves) needs its extra; without it, the command answers with one line
naming the extra to install. Exit codes: 0 success, 1 a gate or check failed, 2 usage or input error.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys
from collections.abc import Sequence

from serving.cli_options import OneLineParser, add_log_level

# subcommand -> (module, one-line help, the extra it needs beyond the plain install)
_SUBCOMMANDS: dict[str, tuple[str, str, str | None]] = {
    "convert": ("converters.convert_cli", "convert a checkpoint (Hugging Face Marian or FSMT, fairseq, Marian NMT, "
                "OpenNMT-py, tensor2tensor) into a model package", "convert"),
    "verify": ("converters.verify", "check a package's checksums and the parity of every artifact", "convert"),
    "translate": ("serving.translate_cli", "translate arguments or stdin lines", None),
    "score": ("serving.score_cli", "score given translations: the model's log-likelihood of each, per token and in "
              "total", None),
    "serve": ("serving.serve_cli", "run the HTTP server", None),
    "batch-score": ("batch.cli", "translate and score a TFRecord, JSONL or text file", "batch"),
    "loadtest": ("loadtest.cli", "run Locust against a server and gate on latency targets", "loadtest"),
    "validate": ("loadtest.validate", "parity + quality + latency + cost -> PROMOTE or REJECT", "loadtest"),
    "sweep": ("loadtest.sweep", "measure serving configurations; the cheapest that meets every target", "loadtest"),
    "export-triton": ("serving.triton_export", "write a Triton model repository for a package", None),
}

# extra (pyproject.toml [project.optional-dependencies]) -> the top-level modules its distributions provide
EXTRAS: dict[str, tuple[str, ...]] = {
    "convert": ("onnx", "nncf", "safetensors", "threadpoolctl", "yaml", "sacrebleu"),
    "batch": ("google_crc32c", "sacrebleu", "tritonclient", "geventhttpclient"),
    "ray": ("ray", "pyarrow"),
    "grpc": ("grpc", "tritonclient"),
    "loadtest": ("locust", "tritonclient", "geventhttpclient", "yaml", "sacrebleu", "matplotlib", "tensorflow",
                 "tensorboard"),
}


class UsageError(Exception):
    """Bad arguments or input: reported as one line on stderr, exit code 2."""


def missing_extra(extra: str) -> str | None:
    """None when the modules of ``extra`` are installed, else one line that says what to install."""
    missing = [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return (f"needs the {extra} extra (not installed: {', '.join(missing)}): pip install 'mtgate[{extra}]' "
            f"(in a checkout: pip install -e '.[{extra}]')")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = OneLineParser(prog="mtgate", description="Serve and validate translation Transformers on CPU.")
    level_help = "logging level, before or after the subcommand (default: WARNING; for serve, $MTGATE_LOG_LEVEL)"
    add_log_level(parser, default=None, help=level_help)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text, _) in _SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        add_log_level(sub_parser, help=level_help)
        if name == only:  # the command's own options (`mtgate --help` lists the commands only)
            module = importlib.import_module(module_name)
            module.add_arguments(sub_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args_list if a in _SUBCOMMANDS), None)
    extra = _SUBCOMMANDS[command][2] if command is not None else None
    missing = missing_extra(extra) if extra is not None else None
    if missing is not None:
        sys.stderr.write(f"mtgate {command}: error: {missing}\n")
        return 2
    try:
        parser = build_parser(only=command)
    except ModuleNotFoundError as e:
        sys.stderr.write(f"mtgate: {command}: not available in this install ({e})\n")
        return 2
    try:
        args = parser.parse_args(args_list)
    except SystemExit as e:
        return int(e.code or 0)
    if args.command is None:
        parser.print_help()
        return 2
    logging.basicConfig(level=(args.log_level or "WARNING").upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    module = importlib.import_module(_SUBCOMMANDS[args.command][0])
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
    from serving.cli import main as _main

    sys.exit(_main())
