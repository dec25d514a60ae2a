"""Decoding with a vocabulary shortlist (serving/engine/shortlist.py, ``Translator.load(shortlist=True)``, ``--shortlist``):
each sentence produces only its own candidates, the same whatever it is batched with, and a shortlist that allows
every id changes nothing. Step-level batching with a shortlist: tests/serving/engine/test_continuous.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from serving.commands.main import main
from serving.engine.rows import SlotRows
from serving.engine.shortlist import Shortlist
from serving.engine.translator import DecodeOptions, Translator
from serving.package import PackageError
from tests.utils.marian_factory import corpus

SENTENCES = corpus("en")[100:116]


@pytest.fixture(scope="module", params=["fp32", "int8"])
def shortlisted(request: pytest.FixtureRequest, tiny_shortlist_package: Path) -> Translator:
    return Translator.load(tiny_shortlist_package, precision=request.param, shortlist=True)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_each_sentence_produces_only_its_own_candidates(shortlisted: Translator, beam_size: int) -> None:
    table = shortlisted.backend.shortlist  # type: ignore[attr-defined]
    assert isinstance(table, Shortlist)
    translations = shortlisted.translate(SENTENCES, DecodeOptions(beam_size=beam_size))
    produced_outside_frequent = 0
    for ids, translation in zip(shortlisted.encode(SENTENCES), translations, strict=True):
        allowed = table.candidates(np.asarray([ids]))[0]
        assert allowed[translation.token_ids].all(), translation.token_ids
        produced_outside_frequent += int((~np.isin(translation.token_ids, table.always)).sum())
    assert produced_outside_frequent > 0  # the candidates of the sources are used, not only the frequent ids
    assert shortlisted.info.shortlist


def test_a_sentence_translates_the_same_alone_and_in_a_batch(tiny_shortlist_package: Path) -> None:
    translator = Translator.load(tiny_shortlist_package, shortlist=True)
    for options in (DecodeOptions(beam_size=1), DecodeOptions(beam_size=3)):
        together = [t.token_ids for t in translator.translate(SENTENCES, options)]
        alone = [translator.translate([s], options)[0].token_ids for s in SENTENCES]
        assert together == alone


OPTION_SETS = [
    DecodeOptions(beam_size=1),
    DecodeOptions(beam_size=3, num_hypotheses=2),
    DecodeOptions(beam_size=2, min_length=3, no_repeat_ngram_size=2, repetition_penalty=1.3, disable_unk=True),
    DecodeOptions(beam_size=1, min_length=2, repetition_penalty=1.5),
    DecodeOptions(do_sample=True, seed=3, top_k=8, temperature=1.5),
]


@pytest.mark.parametrize("options", OPTION_SETS, ids=["greedy", "n-best", "beam-rules", "greedy-rules", "sampled"])
def test_searches_over_the_shortlisted_columns_decide_as_over_the_whole_vocabulary(
        tiny_shortlist_package: Path, monkeypatch: pytest.MonkeyPatch, options: DecodeOptions) -> None:
    """The searches read a shortlisted step's K columns (``columns``: their ids); the reference spreads the same
    log-probs over the whole vocabulary (-inf elsewhere), as a search without a shortlist reads them."""
    translator = Translator.load(tiny_shortlist_package, shortlist=True)
    prefix = ["Ein Hund"] * 4
    narrow = translator.translate(SENTENCES, options)
    narrow_prefixed = translator.run(translator.prepare(SENTENCES[:4], options, target_prefix=prefix))
    vocab = translator.info.target_vocab_size
    decode = SlotRows.decode

    def spread(self: SlotRows, tokens: np.ndarray) -> np.ndarray:
        short = decode(self, tokens)
        assert self.columns is not None and short.shape[1] == self.columns.size < vocab
        full = np.full((short.shape[0], vocab), -np.inf, dtype=np.float32)
        full[:, self.columns] = short
        self.columns = None
        return full

    monkeypatch.setattr(SlotRows, "decode", spread)
    wide = translator.translate(SENTENCES, options)
    wide_prefixed = translator.run(translator.prepare(SENTENCES[:4], options, target_prefix=prefix))
    for got, expected in ((narrow, wide), (narrow_prefixed, wide_prefixed)):
        assert [t.token_ids for t in got] == [t.token_ids for t in expected]
        assert [[a.token_ids for a in t.alternatives] for t in got] == \
            [[a.token_ids for a in t.alternatives] for t in expected]
        assert [t.score for t in got] == pytest.approx([t.score for t in expected], abs=1e-5)
    assert all(t.text.startswith("Ein Hund") for t in narrow_prefixed)


def test_a_shortlist_that_allows_every_id_changes_nothing(tiny_shortlist_package: Path) -> None:
    full = Translator.load(tiny_shortlist_package)
    everything = Translator.load(tiny_shortlist_package, shortlist=True)
    table = everything.backend.shortlist  # type: ignore[attr-defined]
    everything.backend.shortlist = Shortlist(  # type: ignore[attr-defined]
        np.zeros(table.source_vocab + 1, dtype=np.int64), np.zeros(0, dtype=np.int64),
        np.arange(table.target_vocab), table.target_vocab)
    for options in (DecodeOptions(beam_size=1), DecodeOptions(beam_size=3, num_hypotheses=2)):
        expected = full.translate(SENTENCES, options)
        got = everything.translate(SENTENCES, options)
        assert [t.token_ids for t in got] == [t.token_ids for t in expected]
        assert [t.score for t in got] == pytest.approx([t.score for t in expected], abs=1e-4)


def test_scoring_references_with_a_shortlist_backend_uses_the_whole_vocabulary(tiny_shortlist_package: Path) -> None:
    full = Translator.load(tiny_shortlist_package)
    shortlisted = Translator.load(tiny_shortlist_package, shortlist=True)
    targets = corpus("de")[100:104]
    expected = [s.log_prob for s in full.score(SENTENCES[:4], targets)]
    assert [s.log_prob for s in shortlisted.score(SENTENCES[:4], targets)] == pytest.approx(expected, abs=1e-4)


def test_a_shortlist_is_refused_where_there_is_none(tiny_package: Path, tiny_shortlist_package: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(PackageError, match="no vocabulary shortlist for onnxruntime/fp32"):
        Translator.load(tiny_package, shortlist=True)
    with pytest.raises(PackageError, match="no vocabulary shortlist for openvino/fp32"):
        Translator.load(tiny_package, runtime="openvino", shortlist=True)
    assert main(["serve", "-m", str(tiny_package), "--shortlist", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "no vocabulary shortlist" in err and "Traceback" not in err
    assert main(["translate", "-m", str(tiny_package), "--shortlist", "a dog"]) == 2
    assert "no vocabulary shortlist" in capsys.readouterr().err


def test_translate_cli_with_the_shortlist(tiny_shortlist_package: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["translate", "-m", str(tiny_shortlist_package), "--shortlist", SENTENCES[0]]) == 0
    shortlisted = capsys.readouterr().out.strip()
    expected = Translator.load(tiny_shortlist_package, shortlist=True).translate([SENTENCES[0]])[0].text
    assert shortlisted == expected


@pytest.mark.parametrize("batching", ["request", "step"])
def test_a_server_started_with_the_shortlist_translates_as_the_engine(tiny_shortlist_package: Path,
                                                                      batching: str) -> None:
    """A real ``mtgate serve --shortlist`` on loopback (the setting read from the environment for step level)."""
    import httpx

    from tests.utils.server import start_server

    flags, env = ("--shortlist", "--batching", batching), None
    if batching == "step":
        flags, env = ("--batching", "step"), {"MTGATE_SHORTLIST": "true"}
    server = start_server(tiny_shortlist_package, *flags, env=env)
    try:
        response = httpx.post(server.url + "/v1/translate", json={"text": SENTENCES[:6]}, timeout=60)
        assert response.status_code == 200, response.text
        served = [t["text"] for t in response.json()["translations"]]
    finally:
        assert server.stop() == 0
    engine = Translator.load(tiny_shortlist_package, shortlist=True)
    assert served == [t.text for t in engine.translate(SENTENCES[:6])]
    assert served != [t.text for t in Translator.load(tiny_shortlist_package).translate(SENTENCES[:6])]
