"""Sharing checkpoints in the Hugging Face format: a transformers model folder (remote code in
`remote/`), the GPT-2 tokenizer files and a model card. Needs the `hf` extra."""

from prism.export.hf import export_hf
from prism.export.source import ExportError

__all__ = ["export_hf", "ExportError"]
