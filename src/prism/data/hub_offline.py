"""Whether the Hugging Face hub is switched off by the environment, by the libraries' own rules.

Training (data.source=hub) and the dry run (the eval datasets) ask this one function, so they
never disagree about a spelling such as HF_HUB_OFFLINE=on.

* huggingface_hub reads `HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE` (the second counts only when the
  first is unset or empty) and is offline when that value, upper-cased, is one of 1, ON, YES,
  TRUE (huggingface_hub.constants); anything else (0, false, no, off, "", ...) is online.
* datasets additionally reads HF_DATASETS_OFFLINE with the same true values. Either switch stops
  a hub stream (datasets reaches the hub through huggingface_hub), so either one counts here.
"""

from __future__ import annotations

import os
from typing import Mapping

TRUE_VALUES = frozenset({"1", "ON", "YES", "TRUE"})  # huggingface_hub's ENV_VARS_TRUE_VALUES


def is_true(value: str | None) -> bool:
    """huggingface_hub's reading of a boolean environment variable."""
    return value is not None and value.upper() in TRUE_VALUES


def hub_offline_switch(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(variable, value) of the environment variable that switches the hub off, or None."""
    env = os.environ if env is None else env
    hub_var = "HF_HUB_OFFLINE" if env.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
    for var in (hub_var, "HF_DATASETS_OFFLINE"):
        if is_true(env.get(var)):
            return var, env[var]
    return None
