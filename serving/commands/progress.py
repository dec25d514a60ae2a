"""Progress on stderr for command-line work that takes more than a couple of seconds (tqdm).

:func:`bar` counts units of work (lines, sentences); :class:`Stages` names the stage a multi-stage job is in. Both
show only on a terminal (never in a log or a pipe, where a command's stderr stays its errors and warnings), only
once the work has run :data:`DELAY_S` seconds (a quick command prints nothing more), and clear their line when
done. ``batch-score`` keeps its own bar (records of a known total, also every 15 s in a pod's log).
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import IO, Any

DELAY_S = 2.0
MININTERVAL_S = 0.1  # tqdm's: redraws at most this often


def on_terminal(stream: IO[str] | None = None, *, beside_output: bool = False) -> bool:
    """Whether progress can be shown on ``stream`` (default stderr): a terminal, and, with ``beside_output``, not
    the terminal the command's output goes to (its lines would break the bar's)."""
    stream = stream or sys.stderr
    if not stream.isatty():
        return False
    return not (beside_output and sys.stdout.isatty())


def bar(desc: str, unit: str, total: int | None = None, *, enabled: bool | None = None,
        stream: IO[str] | None = None) -> Any:
    """A tqdm bar of ``total`` ``unit`` (a plural noun; total None: a count and a rate); a context manager with
    ``update(n)``.

    ``enabled`` None: :func:`on_terminal` of ``stream``. A disabled bar accepts the same calls and shows nothing.
    """
    from tqdm import tqdm

    stream = stream or sys.stderr
    show = on_terminal(stream) if enabled is None else enabled
    return tqdm(total=total, desc=desc, unit=f" {unit}", file=stream, delay=DELAY_S, leave=False, dynamic_ncols=True,
                mininterval=MININTERVAL_S, disable=not show, smoothing=0.1)


class Stages:
    """One line naming the stage a job is in, with the time since it started (``convert: emitting ONNX [00:04]``).

    Call it with each stage's name; use it as a context manager (the line is cleared at the end).
    """

    def __init__(self, what: str, *, enabled: bool | None = None, stream: IO[str] | None = None) -> None:
        from tqdm import tqdm

        stream = stream or sys.stderr
        show = on_terminal(stream) if enabled is None else enabled
        self.what = what
        self._bar = tqdm(total=None, desc=what, bar_format="{desc} [{elapsed}]", file=stream, delay=DELAY_S,
                         leave=False, disable=not show, mininterval=0)

    def __call__(self, stage: str) -> None:
        self._bar.set_description_str(f"{self.what}: {stage}", refresh=False)
        self._bar.update(0)  # shown once DELAY_S has passed (refresh() would show it at once)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> Stages:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
