"""Which artifact ``--precision auto`` (every command's default) loads: :func:`choose_precision`.

int8 is about twice as fast per core as fp32; it is chosen when the package's manifest shows that it costs (almost)
nothing, and fp32 otherwise. The rule, for one runtime:

1. an explicit ``fp32`` or ``int8`` is kept as asked (whether the package has it is ``Manifest.artifact``'s check);
2. no int8 artifact for the runtime: fp32; no fp32 one: int8 (the only one there is);
3. the int8 artifact failed its parity check at conversion (``parity["<runtime>/int8"].passed`` false): fp32;
4. the manifest's ``quality.scores`` hold BLEU of both fp32 and int8 on the same test set (same ``testset``,
   ``beam_size`` and ``sentences``) for the runtime: int8 when, on every such test set, its BLEU is at most
   :data:`INT8_MAX_BLEU_DROP` below fp32's; fp32 otherwise;
5. without such scores, the conversion's parity record: int8 when its next-token agreement with fp32 is at least
   :data:`INT8_MIN_AGREEMENT`; fp32 otherwise, and fp32 when int8 was not verified (``--no-verify``).

The demo package (``models/demo-en-de``) gets int8: its int8 BLEU is within 0.24 of fp32 on both Multi30k test sets
and on paragraphs (``tests/test_demo_model.py`` holds it to 1.0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from serving.package.manifest import Manifest
from serving.package.parse import parse_manifest

AUTO = "auto"
PRECISION_CHOICES = (AUTO, "fp32", "int8")
"""What ``--precision`` and ``MTGATE_PRECISION`` accept: ``auto`` (the default) or an artifact's precision."""

INT8_MAX_BLEU_DROP = 1.0
"""int8 is chosen when its BLEU is at most this far below fp32's on every test set the manifest scores both on (the
bound ``tests/test_demo_model.py`` holds the demo's int8 to)."""

INT8_MIN_AGREEMENT = 0.95
"""Without BLEU in the manifest, int8 is chosen when it picks fp32's next token on at least this share of the
conversion's teacher-forced steps (stricter than the 0.9 floor conversion refuses below; the demo's are 0.995
on onnxruntime and 1.0 on openvino, with no BLEU cost)."""


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision to load and why (one line, for the log)."""

    precision: str
    reason: str

    def describe(self, runtime: str) -> str:
        """``precision auto: onnxruntime/int8 (int8 BLEU within 1.0 of fp32 ...)``."""
        return f"precision auto: {runtime}/{self.precision} ({self.reason})"


def choose_precision(manifest: Manifest | Mapping[str, Any], runtime: str, requested: str = AUTO) -> PrecisionChoice:
    """The precision to load ``runtime`` at: ``requested`` unless it is ``auto``, then the rule of this module.

    Arguments:
        manifest: the package's manifest (a :class:`Manifest` or the dict ``read_manifest`` returns).
        runtime: ``onnxruntime`` or ``openvino``.
        requested: ``auto``, ``fp32`` or ``int8``.

    Returns:
        The precision and the reason it was chosen.
    """
    if requested != AUTO:
        return PrecisionChoice(requested, "asked for")
    typed = manifest if isinstance(manifest, Manifest) else parse_manifest(manifest)
    have = {a.precision for a in typed.artifacts if a.runtime == runtime}
    if "int8" not in have:
        return PrecisionChoice("fp32", f"the package has no {runtime}/int8 artifact")
    if "fp32" not in have:
        return PrecisionChoice("int8", f"the package's only {runtime} artifact")
    parity = typed.parity.get(f"{runtime}/int8")
    if isinstance(parity, Mapping) and parity.get("passed") is False:
        return PrecisionChoice("fp32", "int8 failed its parity check at conversion")
    drops = _bleu_drops(typed.quality, runtime)
    if drops:
        testset, fp32, int8 = max(drops, key=lambda d: d[1] - d[2])
        compared = f"{int8:.2f} vs fp32 {fp32:.2f} on {testset}"
        if fp32 - int8 <= INT8_MAX_BLEU_DROP:
            return PrecisionChoice("int8", f"int8 BLEU within {INT8_MAX_BLEU_DROP:g} of fp32 on {len(drops)} test "
                                           f"set(s) in the manifest, worst {compared}")
        return PrecisionChoice("fp32", f"int8 BLEU more than {INT8_MAX_BLEU_DROP:g} below fp32: {compared}")
    agreement = parity.get("next_token_agreement") if isinstance(parity, Mapping) else None
    if not isinstance(agreement, int | float) or isinstance(agreement, bool):
        return PrecisionChoice("fp32", "no BLEU of int8 in the manifest and int8 was not verified at conversion")
    if agreement >= INT8_MIN_AGREEMENT:
        return PrecisionChoice("int8", f"no BLEU in the manifest; int8 next-token agreement with fp32 "
                                       f"{agreement:.3f} >= {INT8_MIN_AGREEMENT:g}")
    return PrecisionChoice("fp32", f"no BLEU in the manifest; int8 next-token agreement with fp32 {agreement:.3f} "
                                   f"< {INT8_MIN_AGREEMENT:g}")


def _bleu_drops(quality: Mapping[str, Any] | None, runtime: str) -> list[tuple[str, float, float]]:
    """(test set, fp32 BLEU, int8 BLEU) for every test set ``quality.scores`` has both precisions of ``runtime`` on.

    ``quality`` is what ``mtgate convert --quality`` recorded (free-form): rows that are not objects with a string
    ``testset`` and a numeric ``bleu`` are skipped."""
    scores = quality.get("scores") if isinstance(quality, Mapping) else None
    if not isinstance(scores, list):
        return []
    found: dict[tuple[Any, ...], dict[str, float]] = {}
    for row in scores:
        if not isinstance(row, Mapping) or row.get("runtime") != runtime or row.get("precision") not in ("fp32", "int8"):
            continue
        bleu, testset = row.get("bleu"), row.get("testset")
        if not isinstance(testset, str) or not isinstance(bleu, int | float) or isinstance(bleu, bool):
            continue
        key = (testset, row.get("beam_size"), row.get("sentences"))
        found.setdefault(key, {})[str(row["precision"])] = float(bleu)
    return [(key[0], pair["fp32"], pair["int8"]) for key, pair in found.items() if len(pair) == 2]
