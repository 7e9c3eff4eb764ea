"""lm-evaluation-harness adapter: any harness task on a kit checkpoint with `lm_eval` itself
(`python -m prism.eval.harness --model prism ...`; docs/evaluation.md). Needs the `harness` extra."""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from torch.nn.utils.rnn import pad_sequence

from prism.data.tokenizer import EOT_TOKEN, GPT2Tokenizer
from prism.eval.engine import autocast, model_input
from prism.eval.requests import TokenRequest
from prism.eval.tasks import GROUPS, TASKS

eval_logger = logging.getLogger(__name__)


@register_model("prism")
class PrismHarnessLM(TemplateLM):
    """`--model prism --model_args checkpoint=PATH[,device=cuda][,max_length=N]`."""

    def __init__(
        self, checkpoint=None, model=None, batch_size=1, device=None, max_length=None, **_unused
    ) -> None:
        super().__init__()
        if model is None:
            if checkpoint is None:
                raise ValueError(
                    "the prism model needs --model_args checkpoint=PATH "
                    "(a .ckpt, a .safetensors file or an exported run folder)."
                )
            from prism.runs.checkpoint import load_model

            model, _ = load_model(checkpoint)
        if device and str(device).startswith("cuda") and not torch.cuda.is_available():
            # lm_eval's CLI asks for "cuda" unless told otherwise; a CPU machine still works.
            eval_logger.warning("device %s is not available; running the prism model on the CPU", device)
            device = "cpu"
        self._device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = model.to(self._device).eval()
        self.tok = GPT2Tokenizer()
        self._max_length = int(max_length) if max_length else model.cfg.seq_len
        if not 1 <= self._max_length <= model.cfg.seq_len:
            # the decoder reads longer inputs past its training length (RoPE extrapolation);
            # zero-shot scores are defined at the trained context only
            raise ValueError(
                f"--model_args max_length={max_length} is invalid: use 1 to model.seq_len="
                f"{model.cfg.seq_len}, the length the model was trained at."
            )
        self.batch_size_per_gpu = int(batch_size) if str(batch_size) != "auto" else 32

    # ----- what TemplateLM needs ----------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return EOT_TOKEN

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def device(self):
        return self._device

    def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
        return self.tok.encode(string)

    def tok_decode(self, tokens) -> str:
        return self.tok.decode(tokens)

    def _logits(self, idx: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(), autocast(self._device):
            return self.model(idx).float()

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None):
        collator = Collator(requests, sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])))
        out = []
        for chunk in collator.get_batched(n=override_bs or self.batch_size_per_gpu):
            # too long for the window: tokens dropped from the left, the continuation kept
            inputs = [model_input(TokenRequest(ctx, cont), self.max_length)[0] for _, ctx, cont in chunk]
            idx = pad_sequence([torch.tensor(x) for x in inputs], batch_first=True)  # right padding, zeros
            logprobs = F.log_softmax(self._logits(idx.to(self._device)), dim=-1)
            for b, (request, _, cont) in enumerate(chunk):
                end = len(inputs[b])
                lp = logprobs[b, end - len(cont) : end]
                target = torch.tensor(cont, device=self._device)
                greedy = bool((lp.argmax(-1) == target).all())
                # Summed in float64 so a long continuation keeps its last digits (the HF
                # backend sums float32, which moves a 160-nat answer by ~1e-5).
                answer = (float(lp.gather(1, target[:, None]).double().sum()), greedy)
                if request is not None:
                    self.cache_hook.add_partial("loglikelihood", request, answer)
                out.append(answer)
        return collator.get_original(out)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for (text,) in [r.args for r in requests]:
            windows = [
                (None,) + make_disjoint_window(w)
                for w in get_rolling_token_windows(
                    token_list=self.tok_encode(text),
                    prefix_token=self.eot_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                )
            ]
            total = sum(ll for ll, _ in self._loglikelihood_tokens(windows, disable_tqdm=True))
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy decoding, one request at a time (the kit's tasks never generate)."""
        out = []
        for context, gen_kwargs in [r.args for r in requests]:
            until = gen_kwargs.get("until") or [self.tok_decode([EOT_TOKEN])]
            until = [until] if isinstance(until, str) else list(until)
            ids = self.tok_encode(context) or [EOT_TOKEN]
            new: list[int] = []
            for _ in range(int(gen_kwargs.get("max_gen_toks", 256))):
                window = (ids + new)[-self.max_length :]
                nxt = int(self._logits(torch.tensor([window], device=self._device))[0, -1].argmax())
                if nxt == EOT_TOKEN:
                    break
                new.append(nxt)
                if any(u in self.tok_decode(new) for u in until):
                    break
            text = self.tok_decode(new)
            for u in until:
                text = text.split(u)[0]
            out.append(text)
        return out


# ----- the Table 3 tasks on local files ------------------------------------------------------
_HARNESS_YAML = {
    "hellaswag": "hellaswag/hellaswag.yaml",
    "piqa": "piqa/piqa.yaml",
    "arc_easy": "arc/arc_easy.yaml",
    "winogrande": "winogrande/default.yaml",
    "wikitext": "wikitext/wikitext.yaml",
}


def write_local_task_configs(data_dir: str | Path, out_dir: str | Path) -> Path:
    """Task files that keep each harness task as it is and read its rows from data_dir: `json`
    files in place of the hub dataset, the evaluated split named as the harness names it."""
    import lm_eval.tasks
    import yaml

    data_dir, out_dir = Path(data_dir).resolve(), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    src = Path(lm_eval.tasks.__file__).parent
    for name, task in TASKS.items():
        include = src / (_HARNESS_YAML.get(name) or f"blimp/{name[len('blimp_') :]}.yaml")
        key = "test_split" if task.split == "test" else "validation_split"
        cfg = {
            "include": str(include),
            "task": name,
            "dataset_path": "json",
            "dataset_name": None,
            "dataset_kwargs": {"data_files": {task.split: str(data_dir / task.local_file)}},
            **dict.fromkeys(("training_split", "validation_split", "test_split")),
            key: task.split,
        }
        (out_dir / f"{name}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    for group in GROUPS:
        cfg = {"include": str(src / "blimp/_blimp.yaml")}
        (out_dir / f"_{group}.yaml").write_text(yaml.safe_dump(cfg))
    return out_dir


def main(argv: list[str] | None = None) -> None:
    """The harness CLI with the `prism` model registered (and --local-data DIR)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    data_dir = None
    if "--local-data" in argv:
        i = argv.index("--local-data")
        if i + 1 >= len(argv):
            raise SystemExit("--local-data needs a folder laid out like ../shared/data/eval.")
        data_dir = argv[i + 1]
        del argv[i : i + 2]
        if not Path(data_dir).is_dir():
            raise SystemExit(f"--local-data {data_dir} is not a folder.")
    from lm_eval.__main__ import cli_evaluate

    with tempfile.TemporaryDirectory(prefix="prism-harness-tasks-") as tmp:  # the task configs, for this run
        if data_dir is not None:
            argv += ["--include_path", str(write_local_task_configs(data_dir, tmp))]
        sys.argv = ["lm_eval", *argv]
        cli_evaluate()


if __name__ == "__main__":
    main()
