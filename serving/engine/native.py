"""The native core's loader: the C++ extension ``serving.engine._native_core`` (sources in ``serving/engine/_native/``,
built by ``pip install``; ``CMakeLists.txt``), which holds the search core (``serving.engine.decoding.native``) and the
stationary cache's slot bookkeeping (``serving.engine.rows.SlotRows``). Both fall back to their numpy implementations where
:func:`native_core` returns None: the extension is not built (one warning) or ``MTGATE_NATIVE=0`` forces numpy (one
info line)."""

from __future__ import annotations

import functools
import importlib
import logging
import os
from types import ModuleType

logger = logging.getLogger(__name__)

ENV_VAR = "MTGATE_NATIVE"


@functools.cache
def _import() -> ModuleType | None:
    try:
        return importlib.import_module("serving.engine._native_core")
    except ImportError as e:
        logger.warning("the native decoding core is not built (%s): decoding with numpy", e)
        return None


@functools.cache
def _forced_off() -> None:
    logger.info("%s=0: decoding with numpy", ENV_VAR)


def native_core() -> ModuleType | None:
    """The extension module, or None where it is not built or ``MTGATE_NATIVE=0`` (each said once in the log)."""
    if os.environ.get(ENV_VAR, "1").strip() == "0":
        _forced_off()
        return None
    return _import()
