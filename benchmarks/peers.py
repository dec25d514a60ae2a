"""Peer engines of the benchmark (``python -m benchmarks.bench``), run with the peers' interpreter (their own venv:
``benchmarks/setup_peers_venv.sh``).

    python benchmarks/peers.py versions                                  # JSON: the peer libraries installed
    python benchmarks/peers.py make-model --preset opus-mt-en-de --seed 0 --out DIR
    python benchmarks/peers.py prepare --artifact ct2-int8 --model HF_DIR --out DIR
    python benchmarks/peers.py run WORKER_CONFIG.json                    # one engine (config written by the harness)

The real-text mode's engines and CTranslate2 conversions (``ct2-cli-*``) are in ``benchmarks/peers_text.py``.

``make-model`` builds the random-weight Marian model of the benchmark (also used by its ``--quick`` run, so it needs
only torch, transformers and sentencepiece). ``prepare`` converts the HF directory once for a peer:
CTranslate2 (``TransformersConverter``, float32 or int8 weights), optimum ONNX export (fp32, and int8 by dynamic
quantization with ``ORTQuantizer``), optimum-intel OpenVINO export (fp32 weights, and int8 weights). ``run`` loads one
engine and times it with ``benchmarks.bench.measure``, the loop mtgate's own engines use (it imports only the standard
library and numpy, so it loads here without mtgate's dependencies).

Every engine is told to generate exactly N tokens: ``min_new_tokens = max_new_tokens = N`` and no forced EOS
(transformers, optimum), ``min_decoding_length = max_decoding_length = N`` (CTranslate2).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("USE_TF", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks.bench.measure import GenerateFn, package_versions, run_worker  # noqa: E402
from benchmarks.peers_text import CT2_ARTIFACTS, TEXT_LOADERS, prepare_ct2_cli  # noqa: E402

MULTI30K = ROOT / "models" / "data" / "multi30k"
EOS_ID = 0
UNK_ID = 1

# Random-weight model shapes. opus-mt-en-de: Helsinki-NLP/opus-mt-en-de's config (vocab 58101, d_model 512, 6+6
# layers, 8 heads, ffn 2048, swish, sinusoidal positions up to 512, scaled and tied embeddings).
PRESETS: dict[str, dict[str, int]] = {
    "opus-mt-en-de": {"vocab_size": 58101, "d_model": 512, "layers": 6, "heads": 8, "ffn": 2048,
                      "max_positions": 512, "spm_pieces": 1000},
    "tiny": {"vocab_size": 600, "d_model": 32, "layers": 2, "heads": 4, "ffn": 64, "max_positions": 128,
             "spm_pieces": 200},
}

LIBRARIES = ["torch", "transformers", "ctranslate2", "optimum", "optimum-onnx", "optimum-intel", "onnxruntime",
             "openvino", "nncf", "sentencepiece", "numpy", "psutil"]


# ---------------------------------------------------------------------------------------------------------------
# make-model


def _train_spm(lang: str, pieces: int, out: Path) -> None:
    import sentencepiece as spm

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / f"corpus.{lang}"
        with gzip.open(MULTI30K / f"test_2016_flickr.{lang}.gz", "rt", encoding="utf-8") as f:
            corpus.write_text(f.read(), encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(corpus), model_prefix=f"{tmp}/spm", vocab_size=pieces, model_type="unigram",
            character_coverage=1.0, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1, pad_id=-1, num_threads=1,
            hard_vocab_limit=False, minloglevel=2,
        )
        shutil.copyfile(f"{tmp}/spm.model", out)


def make_model(preset: str, seed: int, out: Path) -> None:
    """A random MarianMTModel of ``preset``'s shape in the opus-mt layout (weights, spm models, joint vocab.json).

    The weights are transformers' own initialization of ``MarianConfig`` under ``torch.manual_seed(seed)``. The
    SentencePiece models are trained on Multi30k test_2016; vocab.json maps their pieces first (``</s>`` 0, ``<unk>``
    1), then fillers up to the vocabulary size, ``<pad>`` last, as opus-mt does.
    """
    import sentencepiece as spm
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    shape = PRESETS[preset]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)
    try:
        vocab: dict[str, int] = {}
        for name, lang in (("source.spm", "en"), ("target.spm", "de")):
            _train_spm(lang, shape["spm_pieces"], tmp / name)
            sp = spm.SentencePieceProcessor(model_file=str(tmp / name))
            for i in range(sp.get_piece_size()):
                vocab.setdefault(sp.id_to_piece(i), len(vocab))
        size = shape["vocab_size"]
        if len(vocab) + 1 > size:
            raise SystemExit(f"{preset}: {len(vocab)} pieces do not fit a vocabulary of {size}")
        for i in range(size - 1 - len(vocab)):
            vocab[f"<extra_{i}>"] = len(vocab)
        vocab["<pad>"] = pad = len(vocab)
        (tmp / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        (tmp / "tokenizer_config.json").write_text(json.dumps(
            {"source_lang": "en", "target_lang": "de", "model_max_length": 512, "tokenizer_class": "MarianTokenizer"}),
            encoding="utf-8")
        config = MarianConfig(
            vocab_size=size, decoder_vocab_size=size, d_model=shape["d_model"],
            encoder_layers=shape["layers"], decoder_layers=shape["layers"],
            encoder_attention_heads=shape["heads"], decoder_attention_heads=shape["heads"],
            encoder_ffn_dim=shape["ffn"], decoder_ffn_dim=shape["ffn"], activation_function="swish",
            max_position_embeddings=shape["max_positions"], scale_embedding=True,
            share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
            pad_token_id=pad, eos_token_id=EOS_ID, decoder_start_token_id=pad, forced_eos_token_id=EOS_ID,
        )
        torch.manual_seed(seed)
        model = MarianMTModel(config).eval()
        model.save_pretrained(tmp, safe_serialization=True)
        (tmp / "generation_config.json").unlink(missing_ok=True)
        GenerationConfig(num_beams=4, max_length=shape["max_positions"], bad_words_ids=[[pad]],
                         decoder_start_token_id=pad, pad_token_id=pad, eos_token_id=EOS_ID,
                         forced_eos_token_id=EOS_ID).save_pretrained(tmp)
        (tmp / "bench_model.json").write_text(json.dumps({"preset": preset, "seed": seed, **shape}), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------
# prepare


def _prepare_ct2(model: Path, out: Path, quantization: str | None) -> dict[str, Any]:
    import ctranslate2

    converter = ctranslate2.converters.TransformersConverter(str(model))
    converter.convert(str(out), quantization=quantization, force=True)
    return {"converter": "ctranslate2.converters.TransformersConverter", "quantization": quantization or "float32"}


def _prepare_ort(model: Path, out: Path) -> dict[str, Any]:
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    ORTModelForSeq2SeqLM.from_pretrained(str(model), export=True).save_pretrained(str(out))
    return {"export": "ORTModelForSeq2SeqLM.from_pretrained(export=True)"}


def _prepare_ort_int8(model: Path, out: Path, fp32: Path) -> dict[str, Any]:
    from optimum.onnxruntime import ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    if not (fp32 / ".complete").is_file():
        prepare("ort-fp32", model, fp32)
    qconfig = AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=False)
    tmp = Path(tempfile.mkdtemp(prefix=".q", dir=out))
    onnx_files = sorted(p.name for p in fp32.glob("*.onnx"))
    for name in onnx_files:
        quantizer = ORTQuantizer.from_pretrained(str(fp32), file_name=name)
        quantizer.quantize(save_dir=str(tmp), quantization_config=qconfig)
    # The quantized files are named *_quantized.onnx; give them the names ORTModelForSeq2SeqLM looks for.
    for path in tmp.glob("*.onnx"):
        os.replace(path, out / path.name.replace("_quantized", ""))
    for path in fp32.iterdir():
        if path.is_file() and path.suffix != ".onnx" and not path.name.startswith(".") and path.name != "model.onnx_data":
            shutil.copy2(path, out / path.name)
    shutil.rmtree(tmp, ignore_errors=True)
    return {"quantizer": "ORTQuantizer, AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=False)",
            "files": onnx_files}


def _prepare_ov(model: Path, out: Path, int8: bool) -> dict[str, Any]:
    from optimum.intel import OVModelForSeq2SeqLM

    kwargs: dict[str, Any] = {}
    if int8:
        from optimum.intel import OVWeightQuantizationConfig

        kwargs["quantization_config"] = OVWeightQuantizationConfig(bits=8)
    else:
        kwargs["load_in_8bit"] = False  # optimum-intel compresses big models to int8 by default; fp32 weights here
    OVModelForSeq2SeqLM.from_pretrained(str(model), export=True, compile=False, **kwargs).save_pretrained(str(out))
    return {"export": "OVModelForSeq2SeqLM.from_pretrained(export=True)",
            "weights": "int8 (OVWeightQuantizationConfig(bits=8))" if int8 else "fp32"}


def prepare(artifact: str, model: Path, out: Path) -> None:
    """Convert ``model`` for one peer into ``out`` (atomically; ``out/.complete`` marks a finished artifact)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        if artifact == "ct2-float32":
            about = _prepare_ct2(model, tmp / "model", None)
        elif artifact == "ct2-int8":
            about = _prepare_ct2(model, tmp / "model", "int8")
        elif artifact == "ort-fp32":
            about = _prepare_ort(model, tmp)
        elif artifact == "ort-int8":
            about = _prepare_ort_int8(model, tmp, out.parent / "ort-fp32")
        elif artifact == "ov-fp32":
            about = _prepare_ov(model, tmp, int8=False)
        elif artifact == "ov-int8":
            about = _prepare_ov(model, tmp, int8=True)
        elif artifact in CT2_ARTIFACTS:  # the real-text mode's CTranslate2, converted by its own command
            about = prepare_ct2_cli(artifact, model, tmp)
        else:
            raise SystemExit(f"unknown artifact {artifact!r}")
        about["versions"] = package_versions(LIBRARIES)
        (tmp / ".complete").write_text(json.dumps(about, indent=1), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------
# run


def _hf_generate(model: Any, config: dict[str, Any]) -> GenerateFn:
    """transformers/optimum ``generate`` on padded id batches, exactly N new tokens."""
    import torch

    special = config["special_ids"]
    pad, eos, n = int(special["pad"]), int(special["eos"]), int(config["new_tokens"])

    def generate(batch: list[list[int]], beam: int) -> list[list[int]]:
        width = max(len(s) for s in batch) + 1
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, sentence in enumerate(batch):
            ids[row, : len(sentence) + 1] = torch.tensor([*sentence, eos])
            mask[row, : len(sentence) + 1] = 1
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, num_beams=beam, do_sample=False,
                                 min_new_tokens=n, max_new_tokens=n, forced_eos_token_id=None,
                                 num_return_sequences=1)
        rows = out[:, 1:].tolist()  # drop the decoder start token
        return [[t for t in row if t != pad and t != eos] for row in rows]

    return generate


def _load_transformers(config: dict[str, Any]) -> tuple[GenerateFn, dict[str, Any]]:
    import torch
    from transformers import MarianMTModel

    threads = int(config["threads"])
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    model = MarianMTModel.from_pretrained(config["model"]).eval()
    return _hf_generate(model, config), {
        "versions": package_versions(["torch", "transformers", "numpy"]),
        "settings": {"threads": threads, "dtype": "float32", "torch_num_interop_threads": 1},
    }


def _load_ct2(config: dict[str, Any]) -> tuple[GenerateFn, dict[str, Any]]:
    import ctranslate2

    engine = config["engine"]
    compute_type = "int8" if engine == "ct2-int8" else "float32"
    threads = int(config["threads"])
    translator = ctranslate2.Translator(str(Path(config["artifact"]) / "model"), device="cpu",
                                        compute_type=compute_type, inter_threads=1, intra_threads=threads)
    vocab = json.loads(Path(config["model"], "vocab.json").read_text(encoding="utf-8"))
    tokens = [""] * (max(vocab.values()) + 1)
    for piece, index in vocab.items():
        tokens[index] = piece
    index_of = {piece: index for index, piece in enumerate(tokens)}
    special = config["special_ids"]
    # CTranslate2's Marian loader drops <pad> (the last id) from the vocabulary and starts the decoder from a zero
    # embedding instead, so <pad> can never be generated (transformers: bad_words_ids [[pad]]).
    eos_token = tokens[int(special["eos"])]
    n = int(config["new_tokens"])

    def generate(batch: list[list[int]], beam: int) -> list[list[int]]:
        source = [[tokens[i] for i in sentence] + [eos_token] for sentence in batch]
        results = translator.translate_batch(source, beam_size=beam, min_decoding_length=n, max_decoding_length=n,
                                             max_batch_size=0)
        return [[index_of[t] for t in r.hypotheses[0]] for r in results]

    return generate, {
        "versions": package_versions(["ctranslate2", "numpy"]),
        "settings": {"compute_type": compute_type, "intra_threads": threads, "inter_threads": 1,
                     "weights": "int8" if engine == "ct2-int8" else "float32"},
    }


def _load_ort(config: dict[str, Any]) -> tuple[GenerateFn, dict[str, Any]]:
    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    threads = int(config["threads"])
    torch.set_num_threads(threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    model = ORTModelForSeq2SeqLM.from_pretrained(config["artifact"], session_options=options,
                                                 provider="CPUExecutionProvider")
    return _hf_generate(model, config), {
        "versions": package_versions(["optimum", "optimum-onnx", "onnxruntime", "transformers", "torch"]),
        "settings": {"intra_op_num_threads": threads, "inter_op_num_threads": 1,
                     "weights": "int8 (dynamic quantization)" if config["engine"] == "ort-int8" else "fp32"},
    }


def _load_ov(config: dict[str, Any]) -> tuple[GenerateFn, dict[str, Any]]:
    import torch
    from optimum.intel import OVModelForSeq2SeqLM

    threads = int(config["threads"])
    torch.set_num_threads(threads)
    ov_config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1",
                                 "INFERENCE_NUM_THREADS": threads, "CACHE_DIR": ""}
    if config["engine"] == "ov-fp32":
        ov_config["INFERENCE_PRECISION_HINT"] = "f32"
    model = OVModelForSeq2SeqLM.from_pretrained(config["artifact"], ov_config=ov_config, compile=True)
    precision = _ov_precision(model)
    return _hf_generate(model, config), {
        "versions": package_versions(["optimum-intel", "optimum", "openvino", "transformers", "torch"]),
        "settings": {**{k: v for k, v in ov_config.items() if k != "CACHE_DIR"}, "inference_precision": precision,
                     "weights": "int8" if config["engine"] == "ov-int8" else "fp32"},
    }


def _ov_precision(model: Any) -> str | None:
    """The inference precision the CPU plugin chose for the decoder (bf16 by default on CPUs that have it)."""
    for name in ("decoder", "encoder"):
        part = getattr(model, name, None)
        compiled = getattr(part, "request", None)
        compiled = getattr(compiled, "get_compiled_model", lambda: None)() if compiled is not None else None
        compiled = compiled or getattr(part, "compiled_model", None)
        if compiled is not None:
            try:
                value = compiled.get_property("INFERENCE_PRECISION_HINT")
                return str(value.to_string() if hasattr(value, "to_string") else value)
            except Exception:  # noqa: BLE001 - informational only
                return None
    return None


LOADERS: dict[str, Callable[[dict[str, Any]], tuple[GenerateFn, dict[str, Any]]]] = {
    "transformers-fp32": _load_transformers,
    "ct2-float32": _load_ct2,
    "ct2-int8": _load_ct2,
    "ort-fp32": _load_ort,
    "ort-int8": _load_ort,
    "ov-fp32": _load_ov,
    "ov-default": _load_ov,
    "ov-int8": _load_ov,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="peers.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("versions", help="print the installed peer libraries as JSON")
    make = sub.add_parser("make-model", help="build the random-weight Marian model")
    make.add_argument("--preset", choices=sorted(PRESETS), default="opus-mt-en-de")
    make.add_argument("--seed", type=int, default=0)
    make.add_argument("--out", type=Path, required=True)
    prep = sub.add_parser("prepare", help="convert the HF model for one peer")
    prep.add_argument("--artifact", required=True,
                      choices=["ct2-float32", "ct2-int8", "ort-fp32", "ort-int8", "ov-fp32", "ov-int8", *CT2_ARTIFACTS])
    prep.add_argument("--model", type=Path, required=True)
    prep.add_argument("--out", type=Path, required=True)
    run = sub.add_parser("run", help="measure one engine (worker config written by the harness)")
    run.add_argument("config", type=Path)
    args = parser.parse_args(argv)
    if args.command == "versions":
        sys.stdout.write(json.dumps(package_versions(LIBRARIES)) + "\n")
    elif args.command == "make-model":
        make_model(args.preset, args.seed, args.out)
    elif args.command == "prepare":
        prepare(args.artifact, args.model, args.out)
    else:
        config = json.loads(args.config.read_text(encoding="utf-8"))
        loaders = TEXT_LOADERS if config.get("mode") == "text" else LOADERS
        run_worker(config, loaders[config["engine"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
