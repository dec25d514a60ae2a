"""The peers of the bench's real-text mode (``python -m benchmarks.bench --text``), run with the peers' interpreter
through ``benchmarks/peers.py``: text in, text out, each engine with its own tokenizer.

- ``transformers-fp32``: ``MarianTokenizer`` + ``MarianMTModel.generate`` with the checkpoint's generation config
  (its ``max_length``, bad words and forced EOS), ``num_beams`` as asked, torch threads as asked.
- ``ct2-int8``, ``ct2-int8_float32``, ``ct2-float32``: CTranslate2 ``Translator.translate_batch`` with that compute
  type on a model converted by CTranslate2's own command, ``ct2-transformers-converter`` (int8 weights for the int8
  compute types, float32 weights for float32); the source tokenized with the checkpoint's ``source.spm`` (pieces,
  then ``</s>``, as ``MarianTokenizer`` does), the output pieces decoded with ``target.spm``; CTranslate2's defaults
  otherwise (``max_decoding_length`` 256, length penalty 1).

Each returns, per sentence, the translation and the tokens the engine generated (EOS and padding not counted).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.bench.measure import TranslateFn, package_versions

CT2_CONVERTER = "ct2-transformers-converter"
CT2_ARTIFACTS = {"ct2-cli-int8": "int8", "ct2-cli-float32": "float32"}  # artifact -> --quantization


def prepare_ct2_cli(artifact: str, model: Path, out: Path) -> dict[str, Any]:
    """Convert ``model`` with CTranslate2's own command (beside this interpreter) into ``out/model``."""
    converter = Path(sys.executable).parent / CT2_CONVERTER
    if not converter.is_file():
        raise SystemExit(f"{converter}: no such command (run with the peers' interpreter, --peer-python)")
    command = [str(converter), "--model", str(model), "--output_dir",
               str(out / "model"), "--quantization", CT2_ARTIFACTS[artifact], "--force"]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return {"converter": " ".join([CT2_CONVERTER, *command[1:]])}


def load_transformers_text(config: dict[str, Any]) -> tuple[TranslateFn, dict[str, Any]]:
    import torch
    from transformers import MarianMTModel, MarianTokenizer

    threads = int(config["threads"])
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    tokenizer = MarianTokenizer.from_pretrained(config["model"])
    model = MarianMTModel.from_pretrained(config["model"]).eval()
    skipped = {tokenizer.pad_token_id, tokenizer.eos_token_id}

    def translate(texts: list[str], beam: int) -> list[tuple[str, int]]:
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = model.generate(**batch, num_beams=beam, do_sample=False)
        lengths = [sum(1 for t in row if t not in skipped) for row in out[:, 1:].tolist()]
        return list(zip(tokenizer.batch_decode(out, skip_special_tokens=True), lengths, strict=True))

    return translate, {"versions": package_versions(["torch", "transformers", "sentencepiece"]),
                       "settings": {"threads": threads, "dtype": "float32", "torch_num_interop_threads": 1}}


def load_ct2_text(config: dict[str, Any]) -> tuple[TranslateFn, dict[str, Any]]:
    import ctranslate2
    import sentencepiece as spm

    compute_type = str(config["engine"]).removeprefix("ct2-")
    threads = int(config["threads"])
    translator = ctranslate2.Translator(str(Path(config["artifact"]) / "model"), device="cpu",
                                        compute_type=compute_type, inter_threads=1, intra_threads=threads)
    source = spm.SentencePieceProcessor(model_file=str(Path(config["model"]) / "source.spm"))
    target = spm.SentencePieceProcessor(model_file=str(Path(config["model"]) / "target.spm"))

    def translate(texts: list[str], beam: int) -> list[tuple[str, int]]:
        pieces = [[*sentence, "</s>"] for sentence in source.encode(texts, out_type=str)]
        results = translator.translate_batch(pieces, beam_size=beam, max_batch_size=0)
        return [(target.decode_pieces(r.hypotheses[0]), len(r.hypotheses[0])) for r in results]

    return translate, {"versions": package_versions(["ctranslate2", "sentencepiece"]),
                       "settings": {"compute_type": compute_type, "intra_threads": threads, "inter_threads": 1,
                                    "converted_by": CT2_CONVERTER}}


TEXT_LOADERS = {
    "transformers-fp32": load_transformers_text,
    "ct2-int8": load_ct2_text,
    "ct2-int8_float32": load_ct2_text,
    "ct2-float32": load_ct2_text,
}
