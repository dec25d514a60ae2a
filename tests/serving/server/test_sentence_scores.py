"""The shadow's own sentence chrF and BLEU (``serving.server.shadow.sentence_scores``) equal sacrebleu's
``CHRF().sentence_score`` and ``BLEU(effective_order=True).sentence_score`` on German sentences and their
perturbations, and ``compare`` scores pairs on a server without sacrebleu (the Docker image)."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator

from sacrebleu.metrics.bleu import BLEU
from sacrebleu.metrics.chrf import CHRF

from serving.server.shadow.sentence_scores import sentence_bleu, sentence_chrf, tokenize_13a
from tests.serving.server.conftest import ROOT

DATA = ROOT / "tests" / "data"


def _german() -> list[str]:
    with gzip.open(DATA / "multi30k" / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    lines += (DATA / "marian" / "corpus.de").read_text(encoding="utf-8").splitlines()
    lines += (DATA / "fsmt" / "tricky.de").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip()]


_EDGE = [
    "", " ", ".", "!!", "a", "Ä", "ä ö ü ß", "Äpfel, Öl & Übermaß.", "3.14 und 2,5 Mio. - 10-20 Grad", "1,000,000.",
    "&quot;Hallo&quot; &amp; &lt;Tschüss&gt;", "Er sagte: \"Nein!\" (wirklich?)", "e-mail: a@b.de / 50%",
    "<skipped> Text -\nmit\nZeilen", "Straße\tund  Weg ", "…„Gänsefüßchen“ – Gedankenstrich", "x .", "- 3 -",
]


def _perturb(text: str, rng: random.Random) -> str:
    words = text.split()
    kind = rng.randrange(9)
    if kind == 0 and words:  # drop a word
        del words[rng.randrange(len(words))]
    elif kind == 1 and len(words) > 1:  # swap two words
        i, j = rng.sample(range(len(words)), 2)
        words[i], words[j] = words[j], words[i]
    elif kind == 2 and text:  # character edits
        chars = list(text)
        for _ in range(rng.randint(1, 4)):
            chars[rng.randrange(len(chars))] = rng.choice("aeäöüßxyz.,!? 0123456789")
        return "".join(chars)
    elif kind == 3:  # punctuation and numbers
        words.insert(rng.randrange(len(words) + 1), rng.choice([",", ".", "3,5", "1.000", "2-3", "(", ")", "\"", "—"]))
    elif kind == 4:  # umlauts folded or added
        table = str.maketrans("äöüÄÖÜ", "aouAOU") if rng.random() < 0.5 else str.maketrans("aouAOU", "äöüÄÖÜ")
        return text.translate(table)
    elif kind == 5:
        return text + rng.choice([" ", "  ", " .", "\n", "!"])
    elif kind == 6:
        return rng.choice(_EDGE)
    elif kind == 7:  # a prefix
        return " ".join(words[: rng.randrange(len(words) + 1)])
    # kind 8 (and the cases above that did not apply): repeated words
    return " ".join(words + words[: rng.randint(0, 3)])


def _pairs() -> Iterator[tuple[str, str]]:
    rng = random.Random(39)
    german = _german()
    for reference in rng.sample(german, 1200):
        yield _perturb(reference, rng), reference
        yield reference, _perturb(reference, rng)
        yield _perturb(reference, rng), _perturb(reference, rng)
    for text in german[:200]:
        yield text, text  # identical
        yield text, rng.choice(german)  # unrelated
    for a in _EDGE:
        for b in _EDGE:
            yield a, b


def test_the_formulas_equal_sacrebleus_sentence_scorers() -> None:
    chrf, bleu = CHRF(), BLEU(effective_order=True)
    pairs = list(_pairs())
    assert len(pairs) > 3000
    nonzero = 0
    for hypothesis, reference in pairs:
        expected_chrf = chrf.sentence_score(hypothesis, [reference]).score
        expected_bleu = bleu.sentence_score(hypothesis, [reference]).score
        got_chrf, got_bleu = sentence_chrf(hypothesis, reference), sentence_bleu(hypothesis, reference)
        assert abs(got_chrf - expected_chrf) <= 1e-6, (hypothesis, reference, got_chrf, expected_chrf)
        assert abs(got_bleu - expected_bleu) <= 1e-6, (hypothesis, reference, got_bleu, expected_bleu)
        nonzero += 0 < expected_bleu < 100
    assert nonzero > 1500  # the pairs exercise the formulas, not only their edges


def test_tokenize_13a_cuts_as_mteval() -> None:
    assert tokenize_13a("Er kam um 3.15 Uhr, sagte: \"Hallo!\" (1,5 km) 10-20") == [
        "Er", "kam", "um", "3.15", "Uhr", ",", "sagte", ":", "\"", "Hallo", "!", "\"", "(", "1,5", "km", ")", "10", "-",
        "20",
    ]


_BLOCKED = textwrap.dedent("""
    import json, sys

    class _NoSacrebleu:
        def find_spec(self, name, path=None, target=None):
            if name == "sacrebleu" or name.startswith("sacrebleu."):
                raise ImportError("sacrebleu blocked for this test")
            return None

    sys.meta_path.insert(0, _NoSacrebleu())
    from serving.server.shadow import compare as module

    pair = module.compare("Ein Hund läuft über die Wiese.", "Ein Hund rennt über die Wiese.")
    print(json.dumps({"scorer": module.SCORER, "chrf": pair.chrf, "bleu": pair.bleu,
                      "sacrebleu": "sacrebleu" in sys.modules}))
""")


def test_compare_scores_pairs_without_sacrebleu() -> None:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-c", _BLOCKED], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=60, check=True)
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["sacrebleu"] is False and "sacrebleu is not installed" in out["scorer"]
    expected_chrf = CHRF().sentence_score("Ein Hund rennt über die Wiese.", ["Ein Hund läuft über die Wiese."]).score
    expected_bleu = BLEU(effective_order=True).sentence_score(
        "Ein Hund rennt über die Wiese.", ["Ein Hund läuft über die Wiese."]).score
    assert abs(out["chrf"] - expected_chrf) <= 1e-6 and abs(out["bleu"] - expected_bleu) <= 1e-6
    assert 40 < out["chrf"] < 100 and 0 < out["bleu"] < 100
