"""fairseq, OpenNMT-py and Marian NMT ``.npz`` checkpoints -> packages (issue 16 items 3, 4 and 5), with none of
the frameworks installed, each against an independent numpy forward pass written from its own parameter names.

The checkpoints (tests/utils/checkpoint_parity.py, which lists every shape) are written the way each framework
writes them: fairseq's ``checkpoint_best.pt`` (``args`` or fairseq >= 0.10's omegaconf ``cfg``), OpenNMT-py 3's
``model_step_N.pt`` with its SentencePiece models, Marian's ``model.npz`` with its options as YAML and YAML or
SentencePiece vocabularies; three shapes each, one of them also converted for OpenVINO. For every shape: encoder
outputs (at the tokens the framework's encoder sees: OpenNMT-py's sources have no EOS) and teacher-forced
decoder-step log-probs are within 1e-4 of the reference on 16 Multi30k sentences, and mtgate's search over the ONNX
graphs gives exactly the reference's tokens, and its beam scores within 1e-4, with every decoding case of
tests/utils/decoding_parity.py (greedy, beam 4, a length penalty with forced EOS and bad words, early stopping).
"""

from __future__ import annotations

import numpy as np
import pytest

from serving.package import open_package
from tests.utils.checkpoint_parity import FRAMEWORKS, ConvertedCheckpoints, Framework, source_ids
from tests.utils.decoding_parity import CASES, assert_forward_matches, package_backend, search_tokens

TOL = 1e-4
N_SENTENCES = 16
DECODER_STEPS = 8
MAX_STEPS = 23

SHAPES = [pytest.param(framework, shape, id=f"{framework.name}: {shape}")
          for framework in FRAMEWORKS for shape in framework.shapes]


@pytest.mark.parametrize(("framework", "shape"), SHAPES)
def test_forward_matches_reference(converted_checkpoints: ConvertedCheckpoints, framework: Framework,
                                   shape: str) -> None:
    _, package, ref = converted_checkpoints(framework)[shape]
    ids = framework.ids_of(package)
    inputs = source_ids(package, ids, N_SENTENCES)
    mask = inputs != ids.pad
    if not framework.source_eos:
        mask &= inputs != ids.eos  # what the framework's encoder sees
    vocab = open_package(package).manifest.architecture.target_vocab_size
    targets = np.random.default_rng(5).integers(framework.first_target, vocab, size=(N_SENTENCES, DECODER_STEPS))
    targets[:, 0] = ids.start
    memory = ref.encode(np.where(mask, inputs, ids.pad), mask)
    log_probs = ref.decode(memory, mask, targets)
    assert_forward_matches(package, framework.runtimes(shape), inputs, targets, memory, log_probs, mask, TOL)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("framework", "shape"), SHAPES)
def test_search_equals_reference(converted_checkpoints: ConvertedCheckpoints, framework: Framework, shape: str,
                                 case: str) -> None:
    _, package, ref = converted_checkpoints(framework)[shape]
    ids = framework.ids_of(package)
    inputs = source_ids(package, ids, N_SENTENCES)
    expected, scores = search_tokens(ref.backend(), inputs, ids.start, ids.eos, framework.bad_word, CASES[case],
                                     MAX_STEPS)
    got, got_scores = search_tokens(package_backend(package), inputs, ids.start, ids.eos, framework.bad_word,
                                    CASES[case], MAX_STEPS)
    assert got == expected
    np.testing.assert_allclose(got_scores, scores, rtol=0, atol=1e-4)
