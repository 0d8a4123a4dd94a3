"""Imports litellm once, offline-safe and quiet (its price map is read from the installed copy)."""

from __future__ import annotations

import logging
import os
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
