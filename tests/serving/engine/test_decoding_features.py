"""Decoding features against transformers' ``generate`` (issue 18): n-best, target prefix, min_length, repetition
penalty and no-repeat n-grams.

Two random Marian models, the session's tiny one and an opus-mt-en-de-shaped one (d_model 512, 8 heads, 2 layers),
with EOS made likelier so that hypotheses end at different lengths, each converted to ONNX and OpenVINO IR; mtgate's search runs over each runtime's graphs and must give exactly the
sequences of ``MarianMTModel.generate`` with the same settings (and, with beams, its scores within 1e-4) on 12 corpus
sentences.

- n-best: ``num_hypotheses=4`` of beam 4 is ``num_return_sequences=4``: the same 4 sequences and scores, in order.
- a target prefix is ``generate``'s ``decoder_input_ids`` = start token + prefix (the same length for every
  sentence: transformers needs a rectangular prompt); the length penalty counts only the tokens after it.
- ``min_length`` is ``min_new_tokens``.
- each feature changes the decoded sequences of the same model without it (else the comparison would prove little).
- repetition penalty: beam search only. transformers applies it to log-probs in beam search but to raw logits in
  greedy search, and the graphs return log-probs (``serving.engine.decoding.rules``' docstring).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serving.engine.decoding import SearchOptions, search
from tests.utils.decoding_parity import package_backend
from tests.utils.marian_factory import corpus

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

N_SENTENCES = 12
MAX_LENGTH = 20  # transformers counts the start token (and a prompt): at most 19 tokens after the start token
PREFIX = 2  # prefix tokens per sentence

CASES: dict[str, dict[str, Any]] = {
    "nbest-beam4": {"num_beams": 4, "num_return_sequences": 4},
    "nbest-beam4-lp0.6-forced-eos": {"num_beams": 4, "num_return_sequences": 3, "length_penalty": 0.6,
                                     "forced_eos": True},
    "prefix-greedy": {"num_beams": 1, "prefix": True},
    "prefix-beam4": {"num_beams": 4, "prefix": True},
    "prefix-beam4-nbest-min-length": {"num_beams": 4, "prefix": True, "num_return_sequences": 2,
                                      "min_new_tokens": 4},
    "min-length-greedy": {"num_beams": 1, "min_new_tokens": 8},
    "min-length-beam4": {"num_beams": 4, "min_new_tokens": 8},
    "repetition-penalty-beam4": {"num_beams": 4, "repetition_penalty": 1.8},
    "no-repeat-ngram-greedy": {"num_beams": 1, "no_repeat_ngram_size": 2},
    "no-repeat-ngram-beam4": {"num_beams": 4, "no_repeat_ngram_size": 2},
    "no-repeat-ngram-3-repetition-beam3": {"num_beams": 3, "no_repeat_ngram_size": 3, "repetition_penalty": 1.3},
}


TINY_EOS_BIAS = 3.0  # on EOS's output bias: hypotheses of 1 to 19 tokens, not all capped (en-de-shaped: conftest.py)


@pytest.fixture(scope="module")
def models(tiny_marian_dir: Path, en_de_shaped_package: tuple[Path, Path],
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """name -> (source dir, package dir, MarianMTModel): the tiny model and an en-de-shaped one (the session's, from
    tests/conftest.py), each with its EOS made likelier (so that the length rules matter), converted for both
    runtimes."""
    from converters.convert import convert

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("decoding-features")
    source = root / "tiny"
    shutil.copytree(tiny_marian_dir, source)
    model = transformers.MarianMTModel.from_pretrained(source).eval()
    with torch.no_grad():
        model.final_logits_bias[0, model.config.eos_token_id] += TINY_EOS_BIAS
    model.save_pretrained(source)
    package = root / "tiny-package"
    convert(source, package, runtimes=["onnxruntime", "openvino"], precisions=["fp32"], verify=False)
    en_de_source, en_de_package = en_de_shaped_package
    return {"tiny": (source, package, model),
            "en-de-shaped": (en_de_source, en_de_package,
                             transformers.MarianMTModel.from_pretrained(en_de_source).eval())}


def _inputs(source: Path) -> np.ndarray:
    tokenizer = transformers.MarianTokenizer.from_pretrained(source)
    batch = tokenizer(corpus("en")[:N_SENTENCES], return_tensors="np", padding=True)
    return np.asarray(batch["input_ids"], dtype=np.int64)


def _prefixes(vocab: int, pad: int, eos: int) -> list[list[int]]:
    rng = np.random.default_rng(5)
    return [[int(t) for t in rng.choice([i for i in range(vocab) if i not in (pad, eos)], PREFIX)]
            for _ in range(N_SENTENCES)]


def _generate(model: Any, ids: np.ndarray, case: dict[str, Any], prefixes: list[list[int]] | None
              ) -> tuple[list[list[list[int]]], list[list[float]] | None]:
    config = model.config
    pad, eos, start = config.pad_token_id, config.eos_token_id, config.decoder_start_token_id
    kwargs = {k: v for k, v in case.items() if k not in ("prefix", "forced_eos")}
    kwargs |= {"max_length": MAX_LENGTH, "do_sample": False, "bad_words_ids": None, "renormalize_logits": False,
               "forced_eos_token_id": eos if case.get("forced_eos") else None, "min_length": 0}
    kwargs.setdefault("length_penalty", 1.0)
    if prefixes is not None:
        kwargs["decoder_input_ids"] = torch.tensor([[start, *p] for p in prefixes])
    with torch.no_grad():
        out = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(ids != pad).long(),
                             output_scores=True, return_dict_in_generate=True, **kwargs)
    n = case.get("num_return_sequences", 1)
    sequences = []
    for row in out.sequences[:, 1:].tolist():
        sequences.append(row[: row.index(eos) + 1] if eos in row else [t for t in row if t != pad])
    grouped = [sequences[i * n : (i + 1) * n] for i in range(ids.shape[0])]
    if case["num_beams"] == 1:
        return grouped, None
    scores = out.sequences_scores.tolist()
    return grouped, [scores[i * n : (i + 1) * n] for i in range(ids.shape[0])]


def _search(backend: Any, model: Any, ids: np.ndarray, case: dict[str, Any], prefixes: list[list[int]] | None
            ) -> tuple[list[list[list[int]]], list[list[float]]]:
    config = model.config
    options = SearchOptions(
        eos_id=config.eos_token_id, decoder_start_id=config.decoder_start_token_id, beam_size=case["num_beams"],
        length_penalty=case.get("length_penalty", 1.0), forced_eos=bool(case.get("forced_eos")),
        num_hypotheses=case.get("num_return_sequences", 1), min_length=case.get("min_new_tokens", 0),
        repetition_penalty=case.get("repetition_penalty", 1.0),
        no_repeat_ngram_size=case.get("no_repeat_ngram_size", 0),
    )
    encoded = backend.encode(ids)
    caps = np.full(ids.shape[0], MAX_LENGTH - 1, dtype=np.int64)
    hypotheses = search(backend, encoded.cross_kv, encoded.src_bias, caps, options, prefixes=prefixes)
    tokens = [[h.token_ids] + [a.token_ids for a in h.alternatives] for h in hypotheses]
    scores = [[h.score] + [a.score for a in h.alternatives] for h in hypotheses]
    return tokens, scores


Once = Callable[[tuple[str, ...], Callable[[], Any]], Any]


@pytest.fixture(scope="module")
def once() -> Once:
    """``once(key, compute)``: ``compute()`` the first time a test asks for ``key``, the same value afterwards. For
    what several tests compare and nobody changes, each a deterministic function of its key: the tokenized inputs and
    ``generate``'s output per model and case (the same for both runtimes), a backend per model and runtime (its
    sessions keep nothing between calls: the searches run on backends that have served other tests), and the search
    without the feature per model, runtime and plain settings (shared by the cases of the same beam)."""
    done: dict[tuple[str, ...], Any] = {}

    def get(key: tuple[str, ...], compute: Callable[[], Any]) -> Any:
        if key not in done:
            done[key] = compute()
        return done[key]

    return get


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
@pytest.mark.parametrize("model_name", ["tiny", "en-de-shaped"])
@pytest.mark.parametrize("case_name", list(CASES))
def test_features_match_generate(models: dict[str, Any], once: Once, model_name: str, runtime: str,
                                 case_name: str) -> None:
    if runtime == "openvino":
        pytest.importorskip("openvino")
    source, package, model = models[model_name]
    case = CASES[case_name]
    ids = once(("inputs", model_name), lambda: _inputs(source))
    config = model.config
    prefixes = _prefixes(config.vocab_size, config.pad_token_id, config.eos_token_id) if case.get("prefix") else None
    expected, expected_scores = once(("generate", model_name, case_name),
                                     lambda: _generate(model, ids, case, prefixes))
    backend = once(("backend", model_name, runtime), lambda: package_backend(package, runtime))
    got, got_scores = _search(backend, model, ids, case, prefixes)
    assert got == expected
    if expected_scores is not None:
        np.testing.assert_allclose(np.array(got_scores), np.array(expected_scores), rtol=0, atol=1e-4)
    if prefixes is not None:
        assert all(h[0][:PREFIX] == p for h, p in zip(got, prefixes, strict=True))
    if "min_new_tokens" in case:
        assert all(len(h[0]) - (PREFIX if prefixes else 0) > case["min_new_tokens"] for h in got)
    plain = {"num_beams": case["num_beams"], **({"forced_eos": True} if case.get("forced_eos") else {})}
    if case != plain:  # the feature changes what is decoded (else the comparison would prove little)
        baseline, _ = once(("plain", model_name, runtime, repr(sorted(plain.items()))),
                           lambda: _search(backend, model, ids, plain, None))
        assert [h[0] for h in got] != [h[0] for h in baseline] or "num_return_sequences" in case
