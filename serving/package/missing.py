"""What to add when a model path is not a directory and looks like a Hugging Face hub id (``Helsinki-NLP/opus-mt-en-de``):
that mtgate downloads nothing, and the two commands that make a package of it (download it with the user's own tool,
then ``mtgate convert``). Every command's not-found message for a package or a checkpoint ends with it.
"""

from __future__ import annotations

import re
from pathlib import Path

# A hub id is owner/name, each a name of letters, digits, '.', '_' and '-' (the hub's own rule for repo ids).
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def looks_like_hub_id(path: Path | str) -> bool:
    """``owner/name`` that is not a directory here, and whose ``owner`` is not one either (``models/en-de`` with a
    ``models/`` beside is a mistyped local path, not a hub id)."""
    text = str(path)
    return bool(_HUB_ID.fullmatch(text)) and not Path(text).is_dir() and not Path(text.split("/")[0]).is_dir()


def hub_hint(path: Path | str, *, converting: bool = False) -> str:
    """The sentence to add to a not-found message for ``path`` ('' unless :func:`looks_like_hub_id`)."""
    if not looks_like_hub_id(path):
        return ""
    name = str(path).split("/")[1]
    download = f"huggingface-cli download {path} --local-dir {name}"
    then = f"mtgate convert {name} -o models/{name}"
    if converting:
        return (f"; it looks like a Hugging Face hub id, and mtgate converts local directories, it downloads "
                f"nothing: download it with your own tool first (e.g. `{download}`), then `{then}`")
    return (f"; it looks like a Hugging Face hub id, and mtgate does not download models: download it with your "
            f"own tool (e.g. `{download}`), then `{then}` and pass -m models/{name}")

