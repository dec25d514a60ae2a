"""serving.engine.translator.Translator.

1. Over the HF torch backend (no conversion): a tiny random opus-mt-like Marian checkpoint; the Translator (our
   tokenizer, sorting, sub-batching, numpy search) returns exactly the token ids and texts of ``MarianTokenizer`` +
   ``MarianMTModel.generate`` + ``batch_decode(skip_special_tokens=True)``, with the decoding defaults the Marian
   reader takes from generation_config.json. Also: streaming, max_length, long inputs, bad options, runtime failure.
2. End to end: the same checkpoints converted by ``mtgate convert`` into a package, loaded with ``Translator.load``
   on onnxruntime and openvino fp32, against ``generate`` (a tiny model and one with opus-mt-en-de's shape).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from converters.spec import MASK_VALUE
from serving.engine.encoding import encoder_groups
from serving.engine.errors import InferenceFailed, InputTooLong, InvalidInput
from serving.engine.request import Prepared
from serving.engine.tokenizers.sentencepiece_tokenizer import SentencePieceTokenizer
from serving.engine.translator import DecodeOptions, ModelInfo, TokenIds, Translator
from tests.utils.marian_factory import corpus, make_marian_dir

os.environ.setdefault("USE_TF", "0")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

EOS = 0
MAX_LENGTH = 32  # generation_config max_length (HF counts the start token)


def calibrate_eos(path: Path, texts: list[str]) -> Path:
    """Raise final_logits_bias[EOS] of a saved random Marian checkpoint so that its outputs have varied lengths.

    A random model mostly either ends at once or loops until the length cap; among a grid of EOS biases, keep the
    one giving the most distinct greedy output lengths on ``texts`` (deterministic: fixed weights, CPU float32).
    """
    model = transformers.MarianMTModel.from_pretrained(path).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(path)
    base = float(model.final_logits_bias[0, EOS])
    best, best_distinct = 0.0, 0
    for boost in np.arange(3.0, 6.51, 0.5):
        with torch.no_grad():
            model.final_logits_bias[0, EOS] = base + boost
        distinct = len({len(ids) for ids in hf_translate((model, tokenizer), texts, num_beams=1)[0]})
        if distinct > best_distinct:
            best, best_distinct = float(boost), distinct
    return boost_eos(path, best)


def boost_eos(path: Path, boost: float) -> Path:
    """Add ``boost`` to final_logits_bias[EOS] of a saved Marian checkpoint, in place."""
    from safetensors.torch import load_file, save_file

    weights = load_file(path / "model.safetensors")
    weights["final_logits_bias"][0, EOS] += boost
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


def texts_of_varied_length() -> list[str]:
    lines = corpus("en")
    return [*lines[200:216], " ".join(lines[0].split()[:2]), lines[10] + " " + lines[11], "", "A", "»Ünïcödé« — ✓"]


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    path = make_marian_dir(tmp_path_factory.mktemp("marian") / "src", generation={"max_length": MAX_LENGTH}, seed=2)
    return calibrate_eos(path, texts_of_varied_length())


@pytest.fixture(scope="module")
def hf(marian_dir: Path) -> tuple[Any, Any]:
    torch.set_num_threads(1)
    model = transformers.MarianMTModel.from_pretrained(marian_dir).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(marian_dir)
    return model, tokenizer


def hf_translate(hf: tuple[Any, Any], texts: list[str], **kwargs: Any) -> tuple[list[list[int]], list[str]]:
    """``generate`` on the whole batch; token ids without the start token, cut before EOS."""
    model, tokenizer = hf
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, **kwargs)
    ids = []
    for row in out[:, 1:].tolist():
        ids.append(row[: row.index(EOS)] if EOS in row else [t for t in row if t != model.config.pad_token_id])
    return ids, tokenizer.batch_decode(out, skip_special_tokens=True)


@pytest.fixture(scope="module")
def translator(marian_dir: Path, hf: tuple[Any, Any]) -> Translator:
    from converters.marian import MarianConverter
    from tests.utils.hf_backend import HFMarianBackend

    spec = MarianConverter(marian_dir).load().spec  # the decoding defaults a package of this checkpoint gets
    config = spec.config
    info = ModelInfo(
        name="tiny", version="test", runtime="torch", precision="fp32", source_framework="marian",
        max_input_tokens=config.max_positions, decoding=spec.decoding, source_vocab_size=config.source_vocab_size,
        target_vocab_size=config.target_vocab_size,
    )
    ids = TokenIds(pad=spec.special_ids.pad, eos=spec.special_ids.eos, decoder_start=spec.special_ids.decoder_start)
    tokenizer = SentencePieceTokenizer(marian_dir / "source.spm", marian_dir / "target.spm", marian_dir / "vocab.json")
    # A small budget: the 21 texts are decoded in several sub-batches of different padded lengths.
    return Translator(HFMarianBackend(hf[0]), tokenizer, info, ids, max_batch_tokens=160)


@pytest.fixture(scope="module")
def generated(hf: tuple[Any, Any]) -> dict[int, tuple[list[list[int]], list[str]]]:
    """beam -> ``hf_translate`` of texts_of_varied_length() (computed once, compared by several tests)."""
    return {beam: hf_translate(hf, texts_of_varied_length(), num_beams=beam) for beam in (1, 4)}


@pytest.mark.parametrize("beam", [1, 4])
def test_translator_matches_generate(translator: Translator, hf: tuple[Any, Any], beam: int,
                                     generated: dict[int, tuple[list[list[int]], list[str]]]) -> None:
    texts = texts_of_varied_length()
    expected_ids, expected_texts = generated[beam]
    got = translator.translate(texts, DecodeOptions(beam_size=beam))
    lengths = sorted(len(i) for i in expected_ids)
    assert len(set(lengths)) >= 4 and lengths[-1] >= 10, lengths
    assert [t.token_ids for t in got] == expected_ids
    assert [t.text for t in got] == expected_texts
    assert [t.output_tokens for t in got] == [len(i) for i in expected_ids]
    assert [t.input_tokens for t in got] == [len(i) for i in hf[1](texts).input_ids]
    assert all(np.isfinite(t.score) for t in got)


def test_defaults_come_from_generation_config(translator: Translator, hf: tuple[Any, Any]) -> None:
    decoding = translator.info.decoding
    assert (decoding.beam_size, decoding.max_length, decoding.forced_eos) == (4, MAX_LENGTH - 1, True)
    texts = texts_of_varied_length()[:6]
    assert [t.token_ids for t in translator.translate(texts)] == hf_translate(hf, texts)[0]


def test_max_length_caps_tokens_excluding_eos(translator: Translator, hf: tuple[Any, Any]) -> None:
    texts = texts_of_varied_length()
    for beam in (1, 4):
        got = translator.translate(texts, DecodeOptions(beam_size=beam, max_length=3))
        assert max(t.output_tokens for t in got) == 3
        # = generate with room for 3 tokens + EOS (+ the start token), EOS forced at the last step.
        assert [t.token_ids for t in got] == hf_translate(hf, texts, num_beams=beam, max_length=5)[0]


def test_count_tokens_and_input_too_long(translator: Translator, hf: tuple[Any, Any]) -> None:
    texts = ["A dog.", "", "two words"]
    assert translator.count_tokens(texts) == [len(i) for i in hf[1](texts).input_ids]
    too_long = " ".join(["word"] * 200)
    with pytest.raises(InputTooLong, match=r"text 1 has \d+ tokens; the model accepts at most 128") as caught:
        translator.translate(["fine", too_long])
    assert (caught.value.index, caught.value.limit) == (1, 128) and caught.value.tokens > 128
    assert translator.translate([]) == []


def test_truncate_cuts_an_over_long_source_to_the_positions(translator: Translator) -> None:
    """The over-long policy: ``truncate`` keeps the first 127 ids and EOS, marks the translation, and the marks
    follow the sentences through a batcher's split, take and join."""
    too_long = " ".join(["word"] * 200)
    options = DecodeOptions(beam_size=1, max_length=4, truncate=True)
    prepared = translator.prepare(["fine", too_long], options)
    full = translator.encode([too_long])[0]
    assert prepared.sources[1] == [*full[:127], translator.ids.eos] and prepared.truncated == (False, True)
    got = translator.run(prepared)
    assert [t.truncated for t in got] == [False, True] and got[1].input_tokens == 128
    assert got[1].token_ids == translator.run(translator.prepare_ids([full[:127]], options))[0].token_ids
    rejoined = Prepared.join([*prepared.take([1, 0]).split(), translator.prepare(["x"], options)])
    assert [t.truncated for t in translator.run(rejoined)] == [True, False, False]
    assert translator.prepare(["fine"], options).truncated == ()
    with pytest.raises(InvalidInput, match="truncate must be true or false, got 1"):
        DecodeOptions(truncate=1)  # type: ignore[arg-type]
    assert DecodeOptions.from_parameters({"truncate": True, "beam_size": 2}) == DecodeOptions(2, None, truncate=True)
    with pytest.raises(InvalidInput, match="parameter 'truncate' must be true or false"):
        DecodeOptions.from_parameters({"truncate": "yes"})


def _recorder(calls: list[tuple[int, str]]) -> Any:
    return lambda index, text: calls.append((index, text))


def test_streaming_partial_texts(translator: Translator) -> None:
    """``on_partial`` carries deltas that concatenate to each translation, greedy and beam (the prefix the live beams
    share, as it grows: more than one delta per sentence), equal to the non-streamed translations."""
    texts = texts_of_varied_length()[:8]
    for beam in (1, 4):
        calls: list[tuple[int, str]] = []
        got = translator.translate(texts, DecodeOptions(beam_size=beam), on_partial=_recorder(calls))
        assert [t.text for t in got] == [t.text for t in translator.translate(texts, DecodeOptions(beam_size=beam))]
        for index, translation in enumerate(got):
            deltas = [text for i, text in calls if i == index]
            assert "".join(deltas) == translation.text
            assert all(deltas)  # only text is reported
        assert len(calls) > len([t for t in got if t.text])


def test_bad_options(translator: Translator) -> None:
    with pytest.raises(InvalidInput, match="beam_size must be a positive integer, got 0"):
        translator.translate(["x"], DecodeOptions(beam_size=0))
    with pytest.raises(InvalidInput, match="max_length must be a positive integer, got 0"):
        translator.translate(["x"], DecodeOptions(max_length=0))


def test_prepare_ids_and_split_join_are_the_same_request(translator: Translator) -> None:
    """Prepared sentences are what ``translate`` decodes: from ids of the package's vocabulary too, and after a
    batcher split them and joined them with others."""
    texts = texts_of_varied_length()[:6]
    options = DecodeOptions(beam_size=2, max_length=6)
    prepared = translator.prepare(texts, options)
    from_ids = translator.prepare_ids([translator.tokenizer.encode(t) for t in texts], options)
    assert from_ids.sources == prepared.sources and from_ids.search == prepared.search
    assert from_ids.caps.tolist() == prepared.caps.tolist()
    expected = [t.token_ids for t in translator.translate(texts, options)]
    assert [t.token_ids for t in translator.run(from_ids)] == expected
    rejoined = Prepared.join([*prepared.take([3, 4, 5]).split(), *prepared.take([0, 1, 2]).split()])
    assert [t.token_ids for t in translator.run(rejoined)] == expected[3:] + expected[:3]
    with pytest.raises(ValueError, match="different search options"):
        Prepared.join([prepared, translator.prepare(texts[:1], DecodeOptions(beam_size=1))])
    with pytest.raises(InvalidInput, match="outside the source vocabulary"):
        translator.prepare_ids([[1, 2], [0, translator.info.source_vocab_size]])


def test_runtime_failure_is_inference_failed(translator: Translator) -> None:
    class Broken:
        def encode(self, input_ids: np.ndarray) -> Any:
            raise RuntimeError("session crashed")

        def decode_step(self, *args: Any) -> Any:
            raise AssertionError

    broken = Translator(Broken(), translator.tokenizer, translator.info, translator.ids)
    with pytest.raises(InferenceFailed, match="torch failed on a batch of 1: session crashed"):
        broken.translate(["x"])


def test_sub_batching_budget(translator: Translator) -> None:
    lengths = np.array([5, 40, 7, 40, 12, 3])
    batches = translator._batches(lengths, beam_size=4)
    assert sorted(np.concatenate(batches).tolist()) == list(range(6))
    for batch in batches:
        assert len(batch) == 1 or len(batch) * 4 * lengths[batch].max() <= translator.max_batch_tokens
    assert lengths[batches[0]].tolist() == [40, 40][: len(batches[0])]


def test_encoder_groups_cut_sorted_rows_into_contiguous_groups() -> None:
    lengths = np.array([39, 30, 25, 22, 21, 20, 19, 18, 17, 17, 15, 14, 13, 12, 11, 10])
    groups = encoder_groups(lengths, call_cost=16)
    assert groups[0][0] == 0 and groups[-1][1] == lengths.size
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(groups, groups[1:], strict=False))
    padded = sum((end - start) * lengths[start] for start, end in groups)
    assert padded + 16 * len(groups) < lengths.size * lengths[0] + 16  # cheaper than one call
    assert encoder_groups(np.array([7, 7, 7, 7])) == [(0, 4)]  # no padding: one call
    assert encoder_groups(np.array([30, 3]), call_cost=0) == [(0, 1), (1, 2)]
    assert encoder_groups(np.array([30, 3]), call_cost=10**6) == [(0, 2)]
    assert encoder_groups(np.array([], dtype=np.int64)) == []


def test_grouped_encoding_equals_one_padded_call(translator: Translator) -> None:
    """Groups encoded at their own lengths and joined give the padded batch's encoder output (padding masked)."""
    texts = texts_of_varied_length()
    sources = sorted(translator.encode(texts), key=len, reverse=True)
    lengths = np.array([len(s) for s in sources])
    ids = np.full((len(sources), lengths.max()), translator.ids.pad, dtype=np.int64)
    for row, source in enumerate(sources):
        ids[row, : len(source)] = source
    assert len(encoder_groups(lengths)) > 1
    whole = translator.backend.encode(ids)
    joined = translator._encode(ids, lengths)
    real = np.arange(ids.shape[1])[None, :] < lengths[:, None]  # [B, S]
    np.testing.assert_array_equal(joined.src_bias[:, 0, 0], np.where(real, 0.0, MASK_VALUE))
    np.testing.assert_array_equal(np.asarray(whole.src_bias)[:, 0, 0], joined.src_bias[:, 0, 0])
    np.testing.assert_allclose(joined.memory[real], np.asarray(whole.memory)[real], atol=1e-5)
    cross_real = np.broadcast_to(real[None, None, :, None, :, None], joined.cross_kv.shape)
    np.testing.assert_allclose(joined.cross_kv[cross_real], np.asarray(whole.cross_kv)[cross_real], atol=1e-5)


def test_max_steps_rules(translator: Translator) -> None:
    lengths = np.array([3, 10, 127])
    assert translator.max_steps(lengths).tolist() == [MAX_LENGTH - 1] * 3
    assert translator.max_steps(lengths, DecodeOptions(max_length=500)).tolist() == [128] * 3  # position table
    t2t_like = dataclasses.replace(
        translator.info, decoding=dataclasses.replace(translator.info.decoding, extra_length=5, max_length=128)
    )
    t2t = Translator(translator.backend, translator.tokenizer, t2t_like, translator.ids)
    assert t2t.max_steps(lengths).tolist() == [8, 15, 128]


# ---------------------------------------------------------------------------------------------------------------
# End to end: mtgate convert -> Translator.load on each runtime == generate


def _convert(source: Path, out: Path) -> Path:
    from converters.convert import convert

    convert(
        source, out, runtimes=["onnxruntime", "openvino"], precisions=["fp32"], verify=True, name="tiny", version="test"
    )
    return out


@pytest.fixture(scope="module")
def package(marian_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _convert(marian_dir, tmp_path_factory.mktemp("package") / "tiny")


@pytest.fixture(params=["onnxruntime", "openvino"])
def runtime(request: pytest.FixtureRequest) -> str:
    if request.param == "openvino":
        pytest.importorskip("openvino")
    return str(request.param)


def test_package_translator_matches_generate(package: Path, hf: tuple[Any, Any], runtime: str,
                                             generated: dict[int, tuple[list[list[int]], list[str]]]) -> None:
    translator = Translator.load(package, runtime=runtime, precision="fp32", threads=1)
    info = translator.info
    assert (info.name, info.version, info.runtime, info.precision, info.source_framework) == (
        "tiny",
        "test",
        runtime,
        "fp32",
        "marian",
    )
    assert (info.max_input_tokens, info.target_vocab_size) == (128, hf[0].config.vocab_size)
    texts = texts_of_varied_length()
    for beam in (1, 4):
        expected_ids, expected_texts = generated[beam]
        got = translator.translate(texts, DecodeOptions(beam_size=beam))
        assert [t.token_ids for t in got] == expected_ids, f"beam {beam}"
        assert [t.text for t in got] == expected_texts


@pytest.fixture(scope="module")
def en_de_shaped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[Any, Any]]:
    """opus-mt-en-de's shape (d_model 512, 8 heads, ffn 2048, swish, scaled embeddings), 2 layers, 2000 ids."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("en-de-shaped")
    source = make_marian_dir(
        root / "src",
        d_model=512,
        layers=2,
        heads=8,
        ffn=2048,
        activation="swish",
        vocab_size=2000,
        max_positions=512,
        init_std=0.05,
        seed=0,
        generation={"max_length": 16},
    )
    # This model either ends at once or runs to the cap; with this EOS bias about half of the greedy outputs end.
    boost_eos(source, 4.5)
    model = transformers.MarianMTModel.from_pretrained(source).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(source)
    # Parity of the graphs themselves is tests/converters/test_marian.py's; here only the decoded tokens count.
    from converters.convert import convert

    package = root / "package"
    convert(source, package, runtimes=["onnxruntime", "openvino"], precisions=["fp32"], verify=False, name="en-de")
    return package, (model, tokenizer)


@pytest.fixture(scope="module")
def en_de_generated(en_de_shaped: tuple[Path, tuple[Any, Any]]) -> dict[int, tuple[list[list[int]], list[str]]]:
    """beam -> ``hf_translate`` of texts_of_varied_length() on the en-de-shaped model (once for both runtimes)."""
    return {beam: hf_translate(en_de_shaped[1], texts_of_varied_length(), num_beams=beam) for beam in (1, 4)}


def test_opus_mt_en_de_shape_matches_generate(en_de_shaped: tuple[Path, tuple[Any, Any]], runtime: str,
                                              en_de_generated: dict[int, tuple[list[list[int]], list[str]]]) -> None:
    package, hf_pair = en_de_shaped
    assert hf_pair[0].config.d_model == 512 and hf_pair[0].config.activation_function == "swish"
    translator = Translator.load(package, runtime=runtime, threads=1)
    texts = texts_of_varied_length()
    for beam in (1, 4):
        expected_ids, expected_texts = en_de_generated[beam]
        got = translator.translate(texts, DecodeOptions(beam_size=beam))
        assert [t.token_ids for t in got] == expected_ids, f"beam {beam}"
        assert [t.text for t in got] == expected_texts
