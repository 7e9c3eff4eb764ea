"""The data pipeline: GPT-2 BPE, registered sources, packing, held-out set, sharding, resume.
The heavy parts are imported lazily, so that `prism.data.tokenizer` stays cheap to import."""

from prism.data.errors import DataError
from prism.data.tokenizer import EOT_TOKEN, GPT2Tokenizer

_LAZY = {
    "TokenStreamDataModule": "prism.data.module",
    "RenamedDataState": "prism.data.module",
    "data_state": "prism.data.module",
    "heldout_windows": "prism.data.module",
    "check_source_reachable": "prism.data.sources",
    "register_source": "prism.data.sources",
    "source_for": "prism.data.sources",
}
__all__ = ["DataError", "EOT_TOKEN", "GPT2Tokenizer", *sorted(_LAZY)]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'prism.data' has no attribute {name!r}")
