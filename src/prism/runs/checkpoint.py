"""Saving and loading model weights without unpickling arbitrary objects: the exported pair
`model.safetensors` + `model_config.json`, or a Lightning `.ckpt` read with weights_only=True."""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path

import torch

from prism import compat
from prism.core.model import ModelConfig, PrismDecoder, model_rope_cache
from prism.core.schedule import ScheduleError
from prism.errors import PrismError, cause
from prism.io import atomic_path, atomic_write_json
from prism.runs.layout import CHECKPOINT_SUFFIX, MODEL_CONFIG_NAME, WEIGHTS_NAME, WEIGHTS_SUFFIX


class CheckpointError(PrismError, ValueError):
    """A checkpoint path or file that cannot be loaded; the message names it."""


def has_sharded_parameters(model: torch.nn.Module) -> bool:
    """Some of the model's parameters are shards (DTensors, as under FSDP) rather than whole."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor  # public since torch 2.6, the kit's floor

    return any(isinstance(p, DTensor) for p in model.parameters())


def save_weights(path: Path, state: dict[str, torch.Tensor], tied: bool, prefix: str = "") -> None:
    """`state` as a safetensors file, its keys but the head's under `prefix`; a tied head is the
    embedding, stored once (safetensors refuses shared storage). atomic_path gives the file the
    usual mode (safetensors' own temp file is 0600) and names it in a failure (a full disk)."""
    from safetensors.torch import save_file

    state = {
        (k if k == "lm_head.weight" else prefix + k): v.detach().cpu().contiguous()
        for k, v in state.items()
        if not (tied and k == "lm_head.weight")
    }
    with atomic_path(path) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})


def export_safetensors(
    model: PrismDecoder,
    out_dir: str | Path,
    meta: dict | None = None,
    state: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write `model.safetensors` and `model_config.json` (ModelConfig + `meta`) atomically; `state`
    (default: the model's own) of a sharded model as export_from_all_ranks gathers it."""
    if state is None:
        if has_sharded_parameters(model):
            raise ValueError(
                "the model is sharded across ranks; call export_from_all_ranks on every rank, "
                "which gathers the full weights before rank 0 writes them."
            )
        state = model.state_dict()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_weights(out_dir / WEIGHTS_NAME, state, model.cfg.tie_embeddings)
    atomic_write_json(out_dir / MODEL_CONFIG_NAME, {"model": model.cfg.to_dict(), **(meta or {})})
    return out_dir / WEIGHTS_NAME


def export_from_all_ranks(
    model: PrismDecoder, out_dir: str | Path, is_rank_zero: bool, meta: dict | None = None
) -> Path | None:
    """`export_safetensors` on every rank of a model that may be sharded (its weights gathered to rank
    0's CPU by a collective): the weights file on rank 0, which writes it; None on the others."""
    state = None
    if has_sharded_parameters(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return export_safetensors(model, out_dir, meta=meta, state=state) if is_rank_zero else None


def _model_from(model_dict: dict, state: dict[str, torch.Tensor], source: Path) -> PrismDecoder:
    try:
        cfg = ModelConfig(**model_dict)
    except (TypeError, ValueError, ScheduleError) as exc:  # ModelConfig's checks, its head schedule's
        raise CheckpointError(f"{source}: its model config is not valid ({exc}).") from None
    with torch.device("meta"):
        model = PrismDecoder(cfg)
    if cfg.tie_embeddings:
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    try:
        missing = model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as exc:  # torch lists every problem, one a line under a heading: name the first
        first = next((line.strip() for line in str(exc).splitlines()[1:] if line.strip()), str(exc).strip())
        raise CheckpointError(
            f"{source}: weights do not match the model config ({first.rstrip('.')})."
        ) from None
    missing_keys = [k for k in missing.missing_keys if not (cfg.tie_embeddings and k == "lm_head.weight")]
    if missing_keys or missing.unexpected_keys:
        raise CheckpointError(
            f"{source}: weights do not match the model config (missing {missing_keys[:3]}, "
            f"unexpected {missing.unexpected_keys[:3]})."
        )
    if cfg.tie_embeddings:
        model.lm_head.weight = model.wte.weight
    # Non-persistent RoPE tables were created on the meta device; rebuild them for real.
    for block in model.blocks:
        block.attn.rope_cos, block.attn.rope_sin = model_rope_cache(cfg, block.attn.head_dim)
    return model.eval()


def weights_path(path: str | Path) -> Path:
    """The weights file a checkpoint argument names: a .ckpt, a .safetensors, or a run folder."""
    path = Path(path)
    if path.is_dir():
        if (path / WEIGHTS_NAME).is_file():
            return path / WEIGHTS_NAME
        raise CheckpointError(
            f"{path} is a folder without {WEIGHTS_NAME}; pass a {CHECKPOINT_SUFFIX} or "
            f"{WEIGHTS_SUFFIX} file or a folder holding {WEIGHTS_NAME}."
        )
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist.")
    if path.suffix not in (CHECKPOINT_SUFFIX, WEIGHTS_SUFFIX):
        raise CheckpointError(
            f"checkpoint {path} has suffix {path.suffix!r}; use {CHECKPOINT_SUFFIX} or {WEIGHTS_SUFFIX}."
        )
    return path


def ckpt_problem(path: Path, exc: BaseException) -> str:
    """Why torch.load(weights_only=True) could not open `path`, in the kit's words: never
    torch's advice to retry with weights_only=False, which would run whatever the file holds."""
    try:
        size = path.stat().st_size
    except OSError as err:
        return f"it cannot be read ({err.strerror or type(err).__name__})"
    if size == 0:
        return "it is empty (0 bytes)"
    if not zipfile.is_zipfile(path):
        return (
            f"it is not a torch checkpoint ({size} bytes that are not a torch.save zip archive): "
            "it is cut short, corrupt or another kind of file"
        )
    if isinstance(exc, pickle.UnpicklingError):
        return (
            "it holds objects other than tensors and plain containers, which a weights-only load "
            "refuses; it was not written by this kit"
        )
    return f"it is a damaged torch checkpoint ({cause(exc, 160)})"


def open_ckpt(path: str | Path, mmap: bool = False) -> dict:
    """A Lightning `.ckpt` loaded with torch.load(weights_only=True) (mmap=True maps it instead
    of reading its tensors), or a CheckpointError naming the file and what is wrong with it."""
    path = Path(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torch raises RuntimeError, UnpicklingError, EOFError, OSError...
        raise CheckpointError(f"checkpoint {path} cannot be opened: {ckpt_problem(path, exc)}.") from None
    if not isinstance(ckpt, dict):
        raise CheckpointError(
            f"checkpoint {path} holds a {type(ckpt).__name__}, not a Lightning checkpoint's dict."
        )
    return ckpt


def _ckpt_meta(ckpt: dict) -> dict:
    hp = ckpt.get("hyper_parameters") or {}
    return {**{k: v for k, v in hp.items() if k != "model"}, "step": ckpt.get("global_step")}


def _read_config_json(path: Path) -> dict:
    cfg_path = path.with_name(MODEL_CONFIG_NAME)  # the exported pair's config, beside the weights
    if not cfg_path.is_file():
        raise CheckpointError(f"{path} has no {MODEL_CONFIG_NAME} beside it, so its shape is unknown.")
    try:
        meta = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{cfg_path}, the config of {path}, could not be read ({exc}).") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("model"), dict):
        raise CheckpointError(f"{cfg_path} holds no model config; it was not written by this kit's export.")
    return meta


def read_meta(path: str | Path) -> dict:
    """A checkpoint's metadata (scale, schedule, seed, run config, ...) without its weights: the
    dict `load_model` returns beside the model. A .ckpt is memory-mapped, not read."""
    path = weights_path(path)
    if path.suffix == WEIGHTS_SUFFIX:
        return {k: v for k, v in _read_config_json(path).items() if k != "model"}
    return _ckpt_meta(open_ckpt(path, mmap=True))


def load_model(path: str | Path) -> tuple[PrismDecoder, dict]:
    """(PrismDecoder on the CPU in eval mode, metadata) of a `.ckpt`, `.safetensors` or exported folder."""
    path = weights_path(path)
    model_dict, state, meta = _read_weights(path, shapes_only=False)
    return _model_from(model_dict, state, path), meta


def check_weights(path: str | Path) -> None:
    """Everything load_model checks (the file opens whole, a valid model config, every weight at its
    shape) from the safetensors header or a memory-mapped .ckpt: no tensor is read."""
    path = weights_path(path)
    model_dict, state, _ = _read_weights(path, shapes_only=True)
    _model_from(model_dict, state, path)


# safetensors' dtype names; an integer tensor where a weight belongs is refused as load_model refuses it
_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def _meta_tensor(tensor_slice) -> torch.Tensor:
    """A tensor of the stored shape and dtype on the meta device: nothing is read."""
    dtype = _SAFETENSORS_DTYPES.get(tensor_slice.get_dtype(), torch.float32)
    return torch.empty(tensor_slice.get_shape(), dtype=dtype, device="meta")


def _read_weights(path: Path, shapes_only: bool) -> tuple[dict, dict[str, torch.Tensor], dict]:
    """(model config, state dict, metadata) of a weights file; with `shapes_only` the state holds
    meta tensors of the file's shapes (safetensors) or mapped ones (.ckpt)."""
    if path.suffix == WEIGHTS_SUFFIX:
        from safetensors import safe_open
        from safetensors.torch import load_file

        meta = _read_config_json(path)
        try:
            if shapes_only:  # safe_open refuses a file its header does not cover exactly (cut short)
                with safe_open(str(path), framework="pt") as f:
                    state = {k: _meta_tensor(f.get_slice(k)) for k in f.keys()}
            else:
                state = load_file(str(path))
        except Exception as exc:  # safetensors raises its own SafetensorError, OSError...
            raise CheckpointError(
                f"{path} cannot be opened: it is not a readable safetensors file ({exc}); it is "
                "cut short, corrupt or another kind of file."
            ) from None
        return meta.pop("model"), state, meta
    ckpt = open_ckpt(path, mmap=shapes_only)
    hp = ckpt.get("hyper_parameters") or {}
    if "model" not in hp:
        raise CheckpointError(
            f"{path} holds no model config in its hyper_parameters; it was "
            f"not written by prism.train.module.PrismLM."
        )
    # the LightningModule's `model.` prefix and torch.compile's `_orig_mod.` wrapper stripped
    state = {
        compat.without_compile_wrapper(k.removeprefix("model.")): v
        for k, v in ckpt["state_dict"].items()
        if k.startswith("model.")
    }
    return dict(hp["model"]), state, _ckpt_meta(ckpt)
