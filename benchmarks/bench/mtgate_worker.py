"""mtgate's engine process of the benchmark: ``python -m benchmarks.bench.mtgate_worker WORKER_CONFIG.json``.

Forcing the output length: peers use ``min_new_tokens = max_new_tokens = N`` (transformers/optimum) or
``min_decoding_length = max_decoding_length = N`` (CTranslate2): EOS is masked for N steps and decoding stops at N.
mtgate's ``DecodeOptions`` has no minimum length, so the worker loads the package as usual and overrides the
package's decoding defaults for the run: EOS joins ``bad_word_ids``, ``max_length = N``, no forced EOS. That is the
same N decoder steps, through the same ``Translator.translate`` path a server request takes.

Token ids in, token ids out: the harness tokenized the sentences once and every engine gets the same ids, so no
engine's time includes tokenization (the translator's tokenizer is replaced by :class:`IdsTokenizer`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench.measure import GenerateFn, TranslateFn, package_versions, run_worker


class IdsTokenizer:
    """Texts that are space-separated token ids: the bench feeds every engine the same ids."""

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]

    def encode_target(self, text: str) -> list[int]:
        return self.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(map(str, ids))


def forced_length_translator(package: Path | str, runtime: str, precision: str, threads: int,
                             new_tokens: int) -> Any:
    """A ``Translator`` on ``package`` that reads ids (:class:`IdsTokenizer`) and generates exactly ``new_tokens``."""
    from serving.engine.translator import Translator

    translator = Translator.load(package, runtime=runtime, precision=precision, threads=threads)
    decoding = translator.info.decoding
    # Exactly new_tokens tokens: EOS can never be chosen and the cap (EOS included) is new_tokens; no forced EOS.
    forced = dataclasses.replace(
        decoding,
        max_length=new_tokens,
        extra_length=None,
        forced_eos=False,
        bad_word_ids=tuple(sorted({*decoding.bad_word_ids, translator.ids.eos})),
    )
    translator.info = dataclasses.replace(translator.info, decoding=forced)
    translator.tokenizer = IdsTokenizer()
    return translator


def load_mtgate(config: dict[str, Any]) -> tuple[GenerateFn, dict[str, Any]]:
    """The engine of one worker config (``package``, ``runtime``, ``precision``, ``threads``, ``new_tokens``)."""
    from serving.engine.translator import DecodeOptions

    translator = forced_length_translator(config["package"], config["runtime"], config["precision"],
                                          int(config["threads"]), int(config["new_tokens"]))

    def generate(batch: list[list[int]], beam: int) -> list[list[int]]:
        texts = [" ".join(map(str, ids)) for ids in batch]
        return [t.token_ids for t in translator.translate(texts, DecodeOptions(beam_size=beam))]

    about = {
        "versions": package_versions(["mtgate", "onnxruntime", "openvino", "numpy"]),
        "settings": {"runtime": config["runtime"], "precision": config["precision"], "threads": config["threads"],
                     "decoding": dataclasses.asdict(translator.info.decoding)},
    }
    return generate, about


def load_mtgate_text(config: dict[str, Any]) -> tuple[TranslateFn, dict[str, Any]]:
    """The real-text mode's engine (``"mode": "text"``): the package as a server loads it (its tokenizer, its decoding
    defaults), text in and text out."""
    from serving.engine.translator import DecodeOptions, Translator

    translator = Translator.load(config["package"], runtime=config["runtime"], precision=config["precision"],
                                 threads=int(config["threads"]))

    def translate(texts: list[str], beam: int) -> list[tuple[str, int]]:
        return [(t.text, t.output_tokens) for t in translator.translate(texts, DecodeOptions(beam_size=beam))]

    about = {
        "versions": package_versions(["mtgate", "onnxruntime", "openvino", "numpy"]),
        "settings": {"runtime": config["runtime"], "precision": config["precision"], "threads": config["threads"],
                     "decoding": dataclasses.asdict(translator.info.decoding)},
    }
    return translate, about


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of an mtgate engine process."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m benchmarks.bench.mtgate_worker WORKER_CONFIG.json\n")
        return 2
    logging.basicConfig(level=os.environ.get("MTGATE_BENCH_LOG", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    run_worker(config, load_mtgate_text if config.get("mode") == "text" else load_mtgate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
