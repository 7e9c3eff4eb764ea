"""FineWeb data pipeline: GPT-2 BPE, four sources, packing, held-out set, sharding, resume.

`FineWebDataModule` and `heldout_windows` are imported lazily so that `prism.data.tokenizer`
stays cheap to import for code that only needs the BPE.
"""

from prism.data.errors import DataError
from prism.data.tokenizer import EOT_TOKEN, GPT2Tokenizer

__all__ = [
    "DataError",
    "EOT_TOKEN",
    "FineWebDataModule",
    "GPT2Tokenizer",
    "check_source_reachable",
    "heldout_windows",
]


def __getattr__(name):
    if name in ("FineWebDataModule", "heldout_windows"):
        from prism.data import module

        return getattr(module, name)
    if name == "check_source_reachable":
        from prism.data import sources

        return sources.check_source_reachable
    raise AttributeError(f"module 'prism.data' has no attribute {name!r}")
