"""Tokenizers of model packages and :func:`load_tokenizer`, which builds one from a manifest's ``tokenizer`` entry.

Entries (``manifest.json`` -> ``tokenizer``; file paths relative to the package directory)::

    {"kind": "sentencepiece", "files": {"source_spm": ..., "target_spm": ..., "vocab": ..., ["target_vocab": ...]},
     "unk_id": N}
    {"kind": "t2t_subword", "files": {"vocab": ...}}
    {"kind": "fsmt_bpe", "files": {"source_vocab": ..., "target_vocab": ..., "merges": ...},
     "source_lang": "en", "target_lang": "de", "do_lower_case": false, "unk_id": N}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from serving.engine.tokenizers.base import InvalidText, Tokenizer, UnicodeChecked, check_text
from serving.engine.tokenizers.stream import TextStream, open_stream
from serving.package import PackageError

__all__ = ["InvalidText", "TextStream", "Tokenizer", "TOKENIZER_KINDS", "check_text", "load_tokenizer", "open_stream"]

# kind -> file roles it needs
TOKENIZER_KINDS: dict[str, tuple[str, ...]] = {
    "sentencepiece": ("source_spm", "target_spm", "vocab"),
    "t2t_subword": ("vocab",),
    "fsmt_bpe": ("source_vocab", "target_vocab", "merges"),
}


def load_tokenizer(package_dir: Path, entry: dict[str, Any]) -> Tokenizer:
    """Build the tokenizer a manifest's ``tokenizer`` entry describes.

    Arguments:
        package_dir: the model package directory the entry's file paths are relative to.
        entry: the manifest's ``tokenizer`` object.

    Returns:
        A :class:`Tokenizer` whose ``encode`` refuses text that is not valid Unicode (``InvalidText``).

    Raises:
        PackageError: unknown kind, a file role missing from the entry, or a file missing or unreadable.
    """
    kind = entry.get("kind")
    if kind not in TOKENIZER_KINDS:
        raise PackageError(
            f"{package_dir}: unknown tokenizer kind {kind!r} (supported kinds are: {', '.join(TOKENIZER_KINDS)})"
        )
    files = entry.get("files") or {}
    paths: dict[str, Path] = {}
    for role in TOKENIZER_KINDS[kind]:
        rel = files.get(role)
        if not isinstance(rel, str):
            raise PackageError(f"{package_dir}: the {kind} tokenizer entry has no {role!r} file")
        paths[role] = _existing(package_dir, rel)
    try:
        if kind == "sentencepiece":
            from serving.engine.tokenizers.sentencepiece_tokenizer import SentencePieceTokenizer

            unk_id = entry.get("unk_id")
            target_vocab = files.get("target_vocab")
            return SentencePieceTokenizer(
                paths["source_spm"],
                paths["target_spm"],
                paths["vocab"],
                None if unk_id is None else int(unk_id),
                None if target_vocab is None else _existing(package_dir, str(target_vocab)),
            )
        # Imported lazily: each package needs one tokenizer implementation only.
        if kind == "fsmt_bpe":
            from serving.engine.tokenizers.fsmt_bpe import FsmtBpeTokenizer

            return FsmtBpeTokenizer(
                paths["source_vocab"], paths["target_vocab"], paths["merges"], str(entry.get("source_lang") or "en"),
                str(entry.get("target_lang") or "de"), do_lower_case=bool(entry.get("do_lower_case", False)),
                clean_up_tokenization_spaces=bool(entry.get("clean_up_tokenization_spaces", False)),
            )
        from serving.engine.tokenizers.subword import SubwordTextEncoder

        return UnicodeChecked(SubwordTextEncoder(paths["vocab"]))
    except (OSError, ValueError) as e:
        raise PackageError(f"{package_dir}: cannot load the {kind} tokenizer: {e}") from e


def _existing(package_dir: Path, rel: str) -> Path:
    path = package_dir / rel
    if not path.is_file():
        raise PackageError(f"{path}: tokenizer file missing")
    return path
