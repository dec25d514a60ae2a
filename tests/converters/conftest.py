"""The converted checkpoints of tests/utils/checkpoint_parity.py, once per session: the parametrized parity suite
(test_checkpoint_parity.py) and each framework's own tests use the same conversions."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.utils.checkpoint_parity import Converted, ConvertedCheckpoints, Framework, convert_shapes


@pytest.fixture(scope="session")
def converted_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> ConvertedCheckpoints:
    """``converted_checkpoints(framework)``: shape -> (checkpoint dir, package dir, numpy reference), converted the
    first time a test asks (skipped where the framework's checkpoints need torch and it is missing)."""
    done: dict[str, dict[str, Converted]] = {}

    def get(framework: Framework) -> dict[str, Converted]:
        if framework.needs_torch:
            pytest.importorskip("torch")
        if framework.name not in done:
            root: Path = tmp_path_factory.mktemp(framework.name)
            done[framework.name] = convert_shapes(framework, root)
        return done[framework.name]

    return get
