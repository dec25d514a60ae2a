"""What goes wrong in batch-score, by who must act: the user's command (exit 2) or the machine during a run (exit 1).

- :class:`InputError`: the inputs cannot be read as asked (a missing file, no usable field...): a usage error.
- :class:`JobError`: the job cannot run as asked (an unwritable output, another run's state in the way, a lock);
  :class:`InputChanged`: the input is not the one the committed chunks were made from.
- :class:`IOFailure`: a file could not be read or written (a full disk, an I/O error): one line with the path, the
  system's reason and what to do. :func:`io_failure` turns an ``OSError`` into one.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from pathlib import Path


class InputError(Exception):
    """The inputs cannot be read as asked (missing file, unknown schema...); reported as a usage error."""


class JobError(Exception):
    """The job cannot run as asked (state of another job in the way, output locked or not writable...)."""


class InputChanged(JobError):
    """The input is not the one the committed chunks were made from."""


class IOFailure(Exception):
    """A file could not be read or written: one line with the path, the system's reason and what to do."""

    def __init__(self, path: Path, error: OSError, action: str) -> None:
        self.path = path
        self.error = error
        reason = error.strerror or str(error)
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            advice = "free some space"
        elif error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            advice = f"make it {'readable' if action == 'read' else 'writable'}"
        else:
            advice = "check the disk"
        super().__init__(f"cannot {action} {path} ({reason}); {advice}")
        self.action = action

    def __reduce__(self) -> tuple[type[IOFailure], tuple[Path, OSError, str]]:
        # Pickled by its arguments (a Ray read task raises it on the driver; pickle's default would call
        # IOFailure(message) and fail, and Ray would report an UnserializableException instead).
        return IOFailure, (self.path, self.error, self.action)


@contextlib.contextmanager
def io_failure(path: Path, action: str) -> Iterator[None]:
    """Raise an ``OSError`` of the block as :class:`IOFailure` on ``path`` (``action``: ``read`` or ``write``)."""
    try:
        yield
    except OSError as e:
        raise IOFailure(Path(e.filename) if action == "read" and e.filename else path, e, action) from e
