"""What every reader's test checks of a checkpoint it must refuse: ``load_source`` raises one ``ConversionError`` that
names the framework in its first line, then gives each reason on a line of its own (collect, then fail once)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from converters.base import ConversionError
from converters.convert import load_source


def assert_refused_at_once(source: Path, framework: str, reasons: Sequence[str]) -> None:
    """``load_source(source)`` fails with ``cannot convert this <framework> checkpoint`` and exactly ``reasons``,
    each on one line of its own."""
    with pytest.raises(ConversionError) as info:
        load_source(source)
    lines = str(info.value).splitlines()
    assert f"cannot convert this {framework} checkpoint" in lines[0], lines[0]
    for reason in reasons:
        assert sum(reason in line for line in lines[1:]) == 1, reason
    assert len(lines) == len(reasons) + 1, lines
