"""The ``mtgate`` commands of this package, registered in ``pyproject.toml`` (entry points ``mtgate.commands``) and
discovered by the dispatcher (``serving.commands.registry``). Nothing else is imported here."""

from __future__ import annotations

from serving.commands.registry import Command

COMMANDS = [
    Command("convert", "converters.convert_cli", "convert a checkpoint (Hugging Face Marian or FSMT, fairseq, "
            "Marian NMT, OpenNMT-py, tensor2tensor) into a model package", "convert", rank=0),
    Command("verify", "converters.verify", "check a package's checksums and the parity of every artifact", "convert",
            rank=1),
]
