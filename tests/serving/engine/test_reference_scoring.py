"""Reference scoring (``serving.engine.reference_scoring``, ``Translator.score``) against transformers' loss.

The session's tiny random Marian checkpoint and its converted package (``tests/conftest.py``): on 32 source/target
pairs, each pair's mean negative log-probability on ONNX Runtime fp32 and OpenVINO fp32 equals
``MarianMTModel(input_ids, attention_mask, labels=labels).loss`` of that pair within 1e-4 (labels:
``MarianTokenizer(text_target=...)``, EOS included). Also: the scores do not depend on how pairs are batched, and
bad input is refused with the pair named.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serving.engine.errors import InputTooLong, InvalidInput
from serving.engine.tokenizers import InvalidText
from serving.engine.translator import Translator
from tests.utils.marian_factory import corpus

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-4
N_PAIRS = 32


@pytest.fixture(scope="module")
def pairs() -> tuple[list[str], list[str]]:
    # Targets are not the sources' translations: any text is a reference; a few are empty (just EOS).
    sources, targets = corpus("en")[:N_PAIRS], corpus("de")[:N_PAIRS]
    targets[5] = ""
    return sources, targets


@pytest.fixture(scope="module")
def hf_losses(tiny_marian_dir: Path, pairs: tuple[list[str], list[str]]) -> np.ndarray:
    """transformers' loss of each pair on its own (the mean negative log-probability of its labels)."""
    torch.set_num_threads(1)
    tokenizer = transformers.MarianTokenizer.from_pretrained(tiny_marian_dir)
    model = transformers.MarianMTModel.from_pretrained(tiny_marian_dir).eval()
    losses = []
    with torch.no_grad():
        for source, target in zip(*pairs, strict=True):
            batch = tokenizer(source, text_target=target, return_tensors="pt")
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
            losses.append(float(out.loss))
    return np.array(losses)


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_scores_equal_transformers_loss(tiny_package: Path, pairs: tuple[list[str], list[str]],
                                        hf_losses: np.ndarray, runtime: str) -> None:
    if runtime == "openvino":
        pytest.importorskip("openvino")
    translator = Translator.load(tiny_package, runtime=runtime, threads=1)
    scores = translator.score(*pairs)
    ours = np.array([-s.mean_log_prob for s in scores])
    difference = float(np.abs(ours - hf_losses).max())
    print(f"{runtime}: max |mean NLL - transformers loss| over {N_PAIRS} pairs = {difference:.2e}")
    assert difference < TOL
    tokenizer = translator.tokenizer
    for score, target in zip(scores, pairs[1], strict=True):
        assert score.token_ids == [*tokenizer.encode_target(target), translator.ids.eos]
        assert score.tokens == len(score.token_ids) == len(score.token_log_probs)
        assert score.log_prob == pytest.approx(sum(score.token_log_probs))
        assert score.perplexity == pytest.approx(math.exp(-score.mean_log_prob))
        assert all(lp <= 0 for lp in score.token_log_probs)


def test_scores_do_not_depend_on_batching(tiny_package: Path, pairs: tuple[list[str], list[str]]) -> None:
    together = Translator.load(tiny_package, threads=1).score(*pairs)
    small = Translator.load(tiny_package, threads=1, max_batch_tokens=40)  # several sub-batches
    apart = small.score(*pairs)
    one_by_one = [small.score([s], [t])[0] for s, t in zip(*pairs, strict=True)][:6]
    for a, b in zip(together, apart, strict=True):
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(a.token_log_probs, b.token_log_probs, atol=1e-5)
    for a, b in zip(together, one_by_one, strict=False):
        np.testing.assert_allclose(a.token_log_probs, b.token_log_probs, atol=1e-5)


def test_bad_input_is_refused_naming_the_pair(tiny_package: Path) -> None:
    translator = Translator.load(tiny_package, threads=1)
    with pytest.raises(InvalidInput, match="2 sources and 1 targets"):
        translator.score(["a", "b"], ["c"])
    with pytest.raises(InvalidText, match=r"target\[1\] holds a lone surrogate"):
        translator.score(["a", "b"], ["c", "d \ud800"])
    limit = translator.info.max_input_tokens
    long = " ".join(["word"] * (limit + 5))
    with pytest.raises(InputTooLong, match=rf"target\[1\] has \d+ tokens; the model accepts at most {limit}") as e:
        translator.score(["a", "b"], ["c", long])
    assert e.value.index == 1
    with pytest.raises(InputTooLong, match=r"source\[0\] has"):
        translator.score([long], ["c"])
    assert translator.score([], []) == []


def test_runtime_failure_is_inference_failed(tiny_package: Path) -> None:
    from serving.engine.errors import InferenceFailed

    translator = Translator.load(tiny_package, threads=1)
    backend = translator.backend

    class Broken:
        def __getattr__(self, name: str) -> Any:
            return getattr(backend, name)

        def decode_step(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("boom")

    translator.backend = Broken()  # type: ignore[assignment]
    with pytest.raises(InferenceFailed, match="onnxruntime failed scoring a batch of 1: boom"):
        translator.score(["a"], ["b"])


def test_score_ids_equals_score_of_the_texts(tiny_package: Path, pairs: tuple[list[str], list[str]]) -> None:
    translator = Translator.load(tiny_package, threads=1)
    sources, targets = pairs[0][:4], pairs[1][:4]
    by_ids = translator.score_ids([translator.tokenizer.encode(s) for s in sources], targets)
    assert by_ids == translator.score(sources, targets)
    with pytest.raises(InvalidInput, match="outside the source vocabulary"):
        translator.score_ids([[10**6]], ["a"])


def test_return_scores_gives_each_output_token_its_log_probability(tiny_package: Path) -> None:
    """``return_scores``: ``token_scores`` are the teacher-forced log-probabilities of the output ids and of EOS
    after them (n-best alternatives too), the same in both batching modes."""
    from serving.engine.continuous import ContinuousDecoder
    from serving.engine.reference_scoring import score_batch
    from serving.engine.translator import DecodeOptions

    translator = Translator.load(tiny_package)
    texts = corpus("en")[40:44]
    options = DecodeOptions(num_hypotheses=2, max_length=6, return_scores=True)
    results = translator.translate(texts, options)
    plain = translator.translate(texts, DecodeOptions(num_hypotheses=2, max_length=6))
    assert [t.token_ids for t in results] == [t.token_ids for t in plain] and plain[0].token_scores is None
    sources = translator.encode(texts)
    for i, translation in enumerate(results):
        for hypothesis in (translation, *translation.alternatives):
            assert hypothesis.token_scores is not None and len(hypothesis.token_scores) == hypothesis.output_tokens + 1
            encoded = translator.encode_batch([sources[i]], np.array([0]))
            expected = score_batch(translator.backend, encoded, [[*hypothesis.token_ids, translator.ids.eos]],
                                   translator.ids.decoder_start)[0]
            np.testing.assert_allclose(hypothesis.token_scores, expected, rtol=0, atol=1e-5)
    decoder = ContinuousDecoder(translator)
    got: dict[str, Any] = {}
    decoder.add(translator.prepare(texts, options), lambda value: got.setdefault("scored", value))
    decoder.add(translator.prepare(texts[:2], DecodeOptions(beam_size=1)), lambda value: got.setdefault("other", value))
    while not decoder.idle:
        decoder.step()
    for step_level, alone in zip(got["scored"], results, strict=True):
        assert step_level.token_ids == alone.token_ids
        np.testing.assert_allclose(step_level.token_scores, alone.token_scores, rtol=0, atol=1e-5)
    assert [t.token_ids for t in got["other"]] == [t.token_ids for t in translator.translate(texts[:2],
                                                                                             DecodeOptions(beam_size=1))]
