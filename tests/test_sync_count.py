"""Host synchronisations on the training path, counted per optimizer step.

On a GPU every read of a device value on the host (`.item()`, `.tolist()`, `float()`, ...), every
`cuda.synchronize` and every collective stalls the CPU until the GPU catches up, so the launch
queue runs dry. The training path must not do any per micro-batch: with accumulation, their
number per optimizer step must not grow. Counted here on real two-process DDP runs (gloo, CPU)
by wrapping those calls (the originals still run): accumulation 1 and 4 at the same global batch
must make the same calls, at most one collective and one read per step, plus one read for the
logger and one for the progress bar per logging interval. fused AdamW is used as on a GPU: the
CPU's unfused AdamW reads its step counters with `.item()` (host tensors, no sync on a GPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import side_by_side

ROOT = Path(__file__).resolve().parents[1]
START, END, LOG_EVERY = 2, 8, 2  # counted: optimizer steps 2..7, three of them logging steps

COUNT_SYNCS = '''"""Run reproduce/train.py's main() with every host-synchronising call counted (see test)."""
import functools
import json
import os
import sys
import threading

import torch
import torch.distributed as dist

COUNTS: dict = {}
ACTIVE = [False]


def counted(name, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if ACTIVE[0] and threading.current_thread() is threading.main_thread():
            COUNTS[name] = COUNTS.get(name, 0) + 1
        return fn(*args, **kwargs)
    return wrapper


# before Lightning is imported, so `from torch.distributed import x` sees the counted one too
for _name in ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__"):
    setattr(torch.Tensor, _name, counted(_name, getattr(torch.Tensor, _name)))
torch.cuda.synchronize = counted("cuda.synchronize", torch.cuda.synchronize)
for _name in ("all_reduce", "broadcast", "all_gather", "all_gather_object", "barrier", "reduce",
              "gather_object", "broadcast_object_list", "all_gather_into_tensor", "reduce_scatter_tensor"):
    setattr(dist, _name, counted(_name, getattr(dist, _name)))

from lightning.pytorch.callbacks import Callback  # noqa: E402

import prism.train.trainer  # noqa: E402


def train_script():
    """reproduce/train.py (its path in PRISM_TRAIN_SCRIPT), imported as a module."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("train_script", os.environ["PRISM_TRAIN_SCRIPT"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Window(Callback):
    """Count from the first micro-batch of optimizer step `start` to the first of `end`."""

    def __init__(self, out, start, end):
        self.out, self.start, self.end = out, start, end

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.start and not ACTIVE[0] and not COUNTS:
            ACTIVE[0] = True
        elif trainer.global_step == self.end and ACTIVE[0]:
            ACTIVE[0] = False
            with open(os.path.join(self.out, f"rank{trainer.global_rank}.json"), "w") as f:
                json.dump(COUNTS, f)


if __name__ == "__main__":
    out, start, end, *argv = sys.argv[1:]
    # the command carries out its plan with trainer.run
    prism.train.trainer.run = functools.partial(prism.train.trainer.run,
                                           extra_callbacks=[Window(out, int(start), int(end))])
    sys.exit(train_script().main(argv))
'''


def start_counting(tmp_path, accumulation) -> subprocess.Popen:
    out = tmp_path / f"acc{accumulation}"
    out.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "OMP_NUM_THREADS": "1",
        "PRISM_TRAIN_SCRIPT": str(ROOT / "reproduce" / "train.py"),
    }
    cmd = [
        sys.executable,
        str(tmp_path / "count_syncs.py"),
        str(out),
        str(START),
        str(END),
        "--scale",
        "tiny",
        "--schedule",
        "prism",
        "--seed",
        "0",
        "model.seq_len=32",
        "train.global_batch_tokens=256",
        f"train.micro_batch={4 // accumulation}",
        "train.tokens=2560",
        "train.lr=3e-3",
        "train.val_every_steps=100",
        "train.ckpt_every_steps=100",
        f"train.log_every_steps={LOG_EVERY}",
        "data.val_tokens=256",
        "train.fused=true",
        "train.accelerator=cpu",
        "train.devices=2",
        "train.strategy=ddp",
        f"runs_dir={tmp_path / f'runs{accumulation}'}",
    ]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    return subprocess.Popen(cmd, env=env, cwd=tmp_path, **pipes)


def counts(tmp_path, *accumulations):
    """The counts of each rank of a run per accumulation, the runs side by side (what is counted is
    calls, which no timing changes)."""
    (tmp_path / "count_syncs.py").write_text(COUNT_SYNCS)  # once: rank 1 reads it when it starts
    for done in side_by_side(*(start_counting(tmp_path, a) for a in accumulations), timeout=800):
        assert done.returncode == 0, done.stderr[-3000:]
    read = lambda a, r: json.loads((tmp_path / f"acc{a}" / f"rank{r}.json").read_text())
    return [[read(a, r) for r in range(2)] for a in accumulations]


@pytest.mark.slow  # two two-process runs side by side, ~40 s on 2 cores
def test_host_syncs_per_optimizer_step_do_not_grow_with_accumulation(tmp_path):
    one, four = counts(tmp_path, 1, 4)
    steps, log_steps = END - START, (END - START) // LOG_EVERY
    collectives = (
        "all_reduce",
        "broadcast",
        "barrier",
        "all_gather",
        "all_gather_object",
        "reduce",
        "gather_object",
        "broadcast_object_list",
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
    )
    for rank in range(2):
        assert four[rank] == one[rank], (rank, one[rank], four[rank])  # 4 micro-batches cost what 1 does
        c = four[rank]
        assert sum(c.get(k, 0) for k in collectives) == steps, c  # the one agreement per step
        assert c.get("cuda.synchronize", 0) == 0
        # one read of that agreement per step; rank 0 also reads the logged loss and redraws
        # the progress bar once per logging interval
        assert sum(c.values()) - steps <= steps + 2 * log_steps, c
