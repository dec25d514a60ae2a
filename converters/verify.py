"""``mtgate verify DIR`` (or ``-m PKG``): checksums of every file, then the parity of every artifact (``converters/parity.py``).

Files the checksum list does not name are reported too: a symlink out of the package fails the check (a copy that
follows links, or ``mtgate export-triton``, would carry another file's contents: export refuses it); any other
unlisted file is a warning (nothing opens it, nothing checks it, export leaves it out) and does not change the exit
code.

Exit codes: 0 every check passes; 1 a file is modified or missing (each named), a symlink leads out of the package,
or an artifact fails its parity check; 2 bad input (not a package, an invalid manifest, a listed path outside the
package, a graph the runtime cannot load: one line).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from converters.parity import INT8_AGREEMENT_FLOOR, run_parity
from serving.commands.options import add_alias, add_package, non_negative_int, package_of, positive_int
from serving.engine.backends import Backend
from serving.package import PackageError, escaping_links, open_package, unlisted_files, verify_checksums


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_package(parser, "DIR", "model package directory")
    parser.add_argument("--checkpoint", type=Path, default=None, metavar="DIR",
                        help="also compare the fp32 artifacts with the checkpoint the package was converted from "
                             "(convert's SRC, read as the same format)")
    add_alias(parser, "--source", "checkpoint", new="--checkpoint", type=Path, metavar="DIR")
    parser.add_argument("--threads", type=positive_int, default=None, metavar="N",
                        help="intra-op threads of the runtime (default: the runtime's)")
    parser.add_argument("--int8-floor", type=float, default=INT8_AGREEMENT_FLOOR,
                        help=f"minimum int8 next-token agreement with fp32 (default: {INT8_AGREEMENT_FLOOR})")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    parser.add_argument("--hparams-set", default=None, help="T2T source only: hparams set (as for convert)")
    parser.add_argument("--vocab", type=Path, default=None, metavar="FILE",
                        help="T2T source only: .subwords vocab (as for convert)")
    parser.add_argument("--target-space-id", type=non_negative_int, default=None, metavar="N",
                        help="T2T source only (as for convert)")


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _format_table(rows: list[dict[str, Any]]) -> str:
    header = ("artifact", "reference", "memory diff", "log_probs diff", "next-token", "greedy", "identical",
              "result")
    lines = [header]
    for row in rows:
        next_token = row.get("next_token_agreement")
        lines.append((
            row["artifact"], row["reference"], f"{row['memory_max_abs']:.2e}", f"{row['log_probs_max_abs']:.2e}",
            _fraction(next_token), _fraction(row["greedy_token_agreement"]),
            _fraction(row["greedy_sentence_exact"]), "PASS" if row["passed"] else "FAIL",
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines) + "\n"


def _source_backend(args: argparse.Namespace, framework: str) -> Backend:
    from converters.base import ConversionError
    from converters.readers import FORMATS, load_source
    from converters.reference import ReferenceModel
    from serving.commands.options import UsageError

    options = {k: v for k, v in (("hparams_set", args.hparams_set), ("vocab", args.vocab),
                                 ("target_space_id", args.target_space_id)) if v is not None}
    try:
        loaded = load_source(args.checkpoint, options, framework if framework in FORMATS else None)
    except ConversionError as e:
        raise UsageError(str(e)) from e
    return ReferenceModel(loaded.spec)


def run(args: argparse.Namespace) -> int:
    from serving.commands.options import UsageError

    try:
        package_dir = package_of(args, "mtgate verify DIR (or -m PKG)")
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        manifest = open_package(package_dir, verify=False).manifest
    except PackageError as e:
        raise UsageError(str(e)) from e
    started = time.perf_counter()
    problems = verify_checksums(package_dir, manifest)
    if problems:
        for problem in problems:
            sys.stderr.write(f"mtgate verify: FAIL checksum {problem}\n")
        sys.stdout.write(f"checksums: FAIL ({len(problems)} file(s) missing or modified)\n")
        return 1
    escaping = escaping_links(package_dir)
    unlisted = [rel for rel in unlisted_files(package_dir, manifest) if rel not in escaping]
    for rel, target in escaping.items():
        sys.stderr.write(f"mtgate verify: FAIL {rel} -> {target}: a symlink out of the package (export-triton "
                         "refuses the package; a copy that follows links carries that file)\n")
    for rel in unlisted:
        sys.stderr.write(f"mtgate verify: WARN {rel}: not in the checksum list (not verified, never opened, left "
                         "out by export-triton)\n")
    source = _source_backend(args, manifest.source_framework) if args.checkpoint is not None else None
    try:
        rows = run_parity(package_dir, manifest, threads=args.threads, source_backend=source,
                          int8_floor=args.int8_floor)
    except PackageError as e:  # a graph the runtime cannot load
        raise UsageError(str(e)) from e
    passed = all(row["passed"] for row in rows) and not escaping
    if args.json:
        checksums = {"files": len(manifest.files), "passed": not escaping, "unlisted": unlisted,
                     "links_out_of_package": escaping}
        report: dict[str, Any] = {"checksums": checksums, "parity": rows, "passed": passed}
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(f"checksums: {_checksums_line(len(manifest.files), unlisted, escaping)}\n")
        sys.stdout.write(f"reference: onnx fp32 = the package's fp32 ONNX graphs ({manifest.reference['encoder']}, "
                         f"...) on onnxruntime{'; source = ' + str(args.checkpoint) if args.checkpoint else ''}\n")
        sys.stdout.write(_format_table(rows))
        sys.stdout.write(f"{'PASS' if passed else 'FAIL'} ({time.perf_counter() - started:.1f}s)\n")
    return 0 if passed else 1


def _checksums_line(files: int, unlisted: list[str], escaping: dict[str, str]) -> str:
    """``OK (12 files)``, with what the list does not cover: unlisted files (a warning), links out (a failure)."""
    notes = []
    if escaping:
        notes.append(f"{len(escaping)} symlink(s) out of the package: {', '.join(escaping)}")
    if unlisted:
        notes.append(f"{len(unlisted)} unlisted file(s), not verified: {', '.join(unlisted[:5])}"
                     + (" ..." if len(unlisted) > 5 else ""))
    return f"{'FAIL' if escaping else 'OK'} ({files} files{''.join('; ' + note for note in notes)})"
