"""Imports litellm once, offline-safe and quiet (its price map is read from the installed copy)."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from collections.abc import Iterator
from types import ModuleType


def litellm() -> ModuleType:
    """The litellm module, imported on first use (it takes seconds; browsing never needs it).

    litellm fetches its model price map from the network at import unless
    ``LITELLM_LOCAL_MODEL_COST_MAP`` is set; we set it (unless the user did) so that runs
    start without network and price calls with the map shipped in the installed litellm.
    """
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm as module

    module.suppress_debug_info = True
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):  # one INFO line per call otherwise
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)
    module.drop_params = True  # parameters a provider does not take are dropped, not fatal
    return module


def quiet() -> contextlib.AbstractContextManager[object]:
    """Inside it, litellm runs no success or failure logging for the calls made (no callbacks).

    litellm marks its own internal calls with the ``is_internal_call`` context variable and
    skips their logging; evolve records every call itself, so it uses the same mark when no
    litellm callback is configured. Without that variable (another litellm) it does nothing.
    """
    lit = litellm()
    try:
        from litellm._internal_context import is_internal_call
    except ImportError:
        return contextlib.nullcontext()
    if lit.callbacks or lit.success_callback or lit.failure_callback:
        return contextlib.nullcontext()  # the user asked litellm to log: let it
    return _marked(is_internal_call)


@contextlib.contextmanager
def _marked(variable: contextvars.ContextVar[bool]) -> Iterator[None]:
    token = variable.set(True)
    try:
        yield
    finally:
        variable.reset(token)
