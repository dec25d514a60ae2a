"""Read a training checkpoint (``torch.save``) without its framework installed and without running its code.

fairseq and OpenNMT-py checkpoints pickle more than tensors: an ``argparse.Namespace`` of options, omegaconf
configs, training meters, numpy RNG states... Unpickling those normally imports (and runs) the framework's classes.
:func:`load_checkpoint` uses torch's ``weights_only`` unpickler, which only builds tensors and plain containers,
and lets every other class named in the file through as an inert :class:`Stub` that keeps the arguments and state
it was given (never calling anything of the original); torch refuses outright anything from ``os``/``sys``
(:func:`load_checkpoint` then says so in one line). :func:`plain` turns what is left (namespaces, omegaconf
containers and nodes, stubs) into plain dicts, lists and scalars.
"""

from __future__ import annotations

import argparse
import pickle
import re
from pathlib import Path
from typing import Any, ClassVar

from converters.base import ConversionError

_UNSAFE = re.compile(r"GLOBAL (\S+) was not an allowed global")
_MAX_ROUNDS = 64


class Stub:
    """Stands in for a class or function the checkpoint names: records what it was built with, does nothing."""

    qualified_name: ClassVar[str] = ""
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    state: Any

    def __new__(cls, *args: Any, **kwargs: Any) -> Stub:
        obj = super().__new__(cls)
        obj.args, obj.kwargs, obj.state = args, kwargs, None
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<stub of {self.qualified_name}>"


def _stub(name: str) -> tuple[type[Stub], str]:
    return type(name.rsplit(".", 1)[-1], (Stub,), {"qualified_name": name}), name


def load_checkpoint(path: Path) -> Any:
    """``torch.load(path)`` with every non-tensor class stubbed (see the module docstring).

    Raises:
        ConversionError: torch is missing, or the file is not a readable torch checkpoint.
    """
    try:
        import torch
    except ImportError:
        raise ConversionError(f"{path}: reading this checkpoint needs torch (pip install 'mtgate[torch]')") from None

    allowed: list[Any] = [argparse.Namespace]
    try:
        allowed += [_stub(n) for n in torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
                    if n != "argparse.Namespace"]
    except Exception:  # noqa: BLE001 - a legacy (non-zip) checkpoint: found one by one below
        pass
    for _ in range(_MAX_ROUNDS):
        try:
            with torch.serialization.safe_globals(allowed):
                return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            found = _UNSAFE.search(str(e))
            if found is None:
                raise ConversionError(f"{path}: not a readable torch checkpoint ({_first_line(e)})") from e
            allowed.append(_stub(found.group(1)))
        except Exception as e:  # noqa: BLE001 - truncated zip, not a pickle, ...: one line naming the file
            raise ConversionError(f"{path}: not a readable torch checkpoint ({type(e).__name__}: "
                                  f"{_first_line(e)})") from e
    raise ConversionError(f"{path}: not a readable torch checkpoint (more than {_MAX_ROUNDS} unknown classes)")


def _first_line(e: BaseException) -> str:
    """The informative line of torch's (long) message: the one naming the refused global, else the first."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [""]
    return next((line for line in lines if "GLOBAL" in line), lines[0])[:200]


def plain(value: Any) -> Any:
    """Namespaces, omegaconf containers (stubbed: their ``_content``) and nodes (``_val``), dicts, lists and tuples
    as plain dicts, lists and scalars; other stubs as None."""
    if isinstance(value, argparse.Namespace):
        return {k: plain(v) for k, v in vars(value).items()}
    if isinstance(value, Stub):
        state = value.state
        if isinstance(state, dict):
            if "_content" in state:
                return plain(state["_content"])
            if "_val" in state:
                return plain(state["_val"])
        return None
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def tensors(state: Any, what: str) -> dict[str, Any]:
    """The floating tensors of a state dict as float32 numpy arrays.

    Raises:
        ConversionError: ``state`` is not a mapping of names to tensors.
    """
    import torch

    if not isinstance(state, dict):
        raise ConversionError(f"{what}: expected a state dict (names -> tensors), got {type(state).__name__}")
    return {str(k): v.detach().to(torch.float32).numpy() for k, v in state.items()
            if isinstance(v, torch.Tensor) and v.is_floating_point()}
