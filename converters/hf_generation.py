"""A Hugging Face checkpoint's generation settings -> :class:`DecodingDefaults`, as transformers' ``generate`` would
decode (Marian, FSMT: ``generation_config.json``, or, without it, the generation keys of ``config.json``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from converters.base import read_json
from converters.spec import DecodingDefaults

logger = logging.getLogger(__name__)

# Generation options we cannot honour; a non-default value is logged and recorded in the manifest's source entry.
IGNORED_GENERATION: dict[str, Any] = {
    "do_sample": False,
    "min_length": 0,
    "min_new_tokens": None,
    "no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "encoder_no_repeat_ngram_size": 0,
    "forced_bos_token_id": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
}


def generation_defaults(src: Path, model: dict[str, Any]) -> tuple[DecodingDefaults, dict[str, Any], list[str]]:
    """Decoding defaults as ``generate`` would use them, the options it ignores, and what cannot be converted.

    Arguments:
        src: the checkpoint directory (``generation_config.json`` wins when present; without it transformers builds
            the generation config from config.json's generation keys).
        model: config.json with the model type's defaults filled in (``eos_token_id``, ``decoder_start_token_id``,
            ``forced_eos_token_id``, ``max_position_embeddings``).

    Returns:
        (defaults, ignored generation options with their values, problems).
    """
    path = src / "generation_config.json"
    gen = read_json(path) if path.is_file() else model
    problems: list[str] = []
    ignored = {k: gen[k] for k, default in IGNORED_GENERATION.items() if k in gen and gen[k] not in (default, None)}
    if ignored:
        logger.warning("%s: generation options not supported by mtgate decoding, ignored: %s", src, ignored)
    eos = gen.get("eos_token_id", model["eos_token_id"])
    if isinstance(eos, list):
        eos = eos[0] if len(eos) == 1 else eos
    if eos is not None and eos != model["eos_token_id"]:
        problems.append(f"generation eos_token_id={json.dumps(eos)} differs from the model's {model['eos_token_id']}")
    start = gen.get("decoder_start_token_id")
    if start is not None and start != model["decoder_start_token_id"]:
        problems.append("generation decoder_start_token_id differs from the model's")
    forced = gen.get("forced_eos_token_id", model["forced_eos_token_id"] if gen is model else None)
    if forced is not None and forced != model["eos_token_id"]:
        problems.append(f"forced_eos_token_id={forced} is not the EOS id {model['eos_token_id']}")
    bad: list[int] = []
    for seq in gen.get("bad_words_ids") or []:
        if isinstance(seq, list) and len(seq) == 1 and isinstance(seq[0], int):
            bad.append(seq[0])
        else:
            problems.append(f"bad_words_ids entry {json.dumps(seq)} (only single-token entries are supported)")
    early = gen.get("early_stopping") or False
    if early == "never":
        ignored["early_stopping"] = "never"
        logger.warning("%s: early_stopping='never' is decoded as early_stopping=false", src)
        early = False
    max_length = max_new_tokens(gen, int(model["max_position_embeddings"]))
    penalty = gen.get("length_penalty")
    defaults = DecodingDefaults(
        beam_size=int(gen.get("num_beams") or 1),
        length_penalty=1.0 if penalty is None else float(penalty),
        length_penalty_kind="hf",
        max_length=max_length,
        bad_word_ids=tuple(bad),
        forced_eos=forced is not None,
        early_stopping=bool(early),
        renormalize_logits=bool(gen.get("renormalize_logits", False)),
    )
    if defaults.max_length < 1:
        problems.append(f"max_length {max_length + 1} leaves no room for a generated token")
    return defaults, ignored, problems


def max_new_tokens(gen: dict[str, Any], max_position_embeddings: int) -> int:
    """How many tokens (EOS included) transformers' ``generate`` produces at most with this generation config.

    ``max_new_tokens`` wins; otherwise ``max_length`` counts the decoder start token too, except that the default
    (20, also what a config without ``max_length`` means: ``save_pretrained`` drops defaults) is taken as 20 *new*
    tokens, within ``max_position_embeddings`` (``GenerationMixin._prepare_generated_length``).
    """
    if gen.get("max_new_tokens") is not None:
        return int(gen["max_new_tokens"])
    max_length = int(gen.get("max_length") or 20)
    if max_length == 20:
        return min(max_length + 1, max_position_embeddings) - 1
    return max_length - 1
