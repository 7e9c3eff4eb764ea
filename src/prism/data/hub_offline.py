"""Whether the Hugging Face hub is switched off by the environment, by the libraries' own rules
(docs/data.md, "Compute nodes without internet"): training and the dry run both ask this."""

from __future__ import annotations

import os
from typing import Mapping

TRUE_VALUES = frozenset({"1", "ON", "YES", "TRUE"})  # huggingface_hub's ENV_VARS_TRUE_VALUES


def hub_offline_switch(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(variable, value) of the environment variable that switches the hub off, or None."""
    env = os.environ if env is None else env
    hub_var = "HF_HUB_OFFLINE" if env.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
    for var in (hub_var, "HF_DATASETS_OFFLINE"):
        if env.get(var, "").upper() in TRUE_VALUES:
            return var, env[var]
    return None
