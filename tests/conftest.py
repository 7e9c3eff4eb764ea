"""Shared fixtures. Real public data lives beside the checkout (never committed); its location
comes from PRISM_SHARED_DATA, which .ci/run sets, and tests needing it skip when it is absent."""

from __future__ import annotations

import importlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from prism.core.model import ModelConfig, PrismDecoder

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

# A suite started in the background (`cmd &` in a script) inherits SIGINT ignored, and so would the
# processes it starts, which the interrupt tests send a Ctrl-C: they get Python's default back.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parents[1]


def train_py(runs_dir, overrides: list[str]) -> list[str]:
    """The command line of reproduce/train.py for the tiny prism seed-0 run under `runs_dir`."""
    return [
        sys.executable,
        str(ROOT / "reproduce" / "train.py"),
        "--scale",
        "tiny",
        "--schedule",
        "prism",
        "--seed",
        "0",
        *overrides,
        f"runs_dir={runs_dir}",
    ]


def load_script(name: str):
    """The command behind reproduce/<name>.py, prism.cli.<name> (its `main(argv)` returns the exit
    code); the script itself must exist and run that same main."""
    script = ROOT / "reproduce" / f"{name}.py"
    assert f"from prism.cli.{name} import" in script.read_text(), script
    return importlib.import_module(f"prism.cli.{name}")


# A search trial on the tiny scale (reproduce/search.py): steps of 64 tokens (2 windows of 32),
# offline data, 128 held-out tokens; each test file adds what its searches need.
SEARCH_TINY = [
    "model.seq_len=32",
    "train.global_batch_tokens=64",
    "train.micro_batch=2",
    "train.lr=3e-3",
    "data.val_tokens=128",
    "data.source=offline",
    "train.log_every_steps=1",
]
SEARCH_TIMEOUT = 600


def parsed(command, argv: list[str]) -> dict:
    """The arguments of a command's function (prism.cli.<name>) that a command line stands for."""
    from prism.cli.command import parse

    return {n: v for n, v in parse(command, argv).items() if n != "print_config"}


def search_args(argv: list[str]):
    """The SearchArgs of a search.py command line."""
    from prism.cli.search import search
    from prism.search.plan import SearchArgs

    return SearchArgs(**parsed(search, argv))


def eval_job(argv: list[str]):
    """The EvalJob of an evaluate.py command line."""
    from prism.cli.evaluate import evaluate
    from prism.eval.job import EvalJob

    a = parsed(evaluate, argv)
    return EvalJob.of_overrides(a["checkpoint"], a["out"], a["overrides"], a["device"], not a["no_progress"])


def prepare_options(argv: list[str]):
    """The PrepareOptions of a prepare_fineweb.py command line."""
    from prism.cli.prepare_fineweb import prepare_fineweb
    from prism.data.prepare import options_for

    return options_for(**parsed(prepare_fineweb, argv))


def search_py(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """reproduce/search.py run to its end, one OpenMP thread per process (workers share 2 cores),
    never waiting on the hub (unreachable here)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "reproduce" / "search.py"), *args],
        capture_output=True,
        text=True,
        timeout=SEARCH_TIMEOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **(env or {})},
    )


def file_stamps(folder: Path, with_folders: bool = False) -> dict:
    """Every file below `folder` (and every folder, `with_folders`): its size and modification
    time, to show that nothing changed."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if with_folders or p.is_file()
    }


# ----- the suite's disk: each trained run holds ~100 MB per checkpoint ----------------------------
# A test's tmp_path goes once it passes (pyproject: tmp_path_retention_policy). What a module's
# fixtures made with tmp_path_factory goes when the module ends with no failure; what a session
# fixture made stays to the end. So the suite holds about one module's runs at a time, not all.
_FAILED_MODULES = pytest.StashKey[set]()
_SESSION_FOLDERS = pytest.StashKey[set]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        item.session.stash.setdefault(_FAILED_MODULES, set()).add(item.nodeid.split("::")[0])
    return report


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if "tmp_path_factory" not in fixturedef.argnames:
        return (yield)
    base = request.getfixturevalue("tmp_path_factory").getbasetemp()
    before = set(base.iterdir())
    try:
        return (yield)
    finally:
        made = set(base.iterdir()) - before
        stash = request.session.stash
        if fixturedef.scope == "session":
            stash.setdefault(_SESSION_FOLDERS, set()).update(made)
        elif fixturedef.scope == "module" and made:
            module = request.node.nodeid

            def remove_unless_failed() -> None:
                if module not in stash.get(_FAILED_MODULES, set()):
                    for folder in made - stash.get(_SESSION_FOLDERS, set()):
                        shutil.rmtree(folder, ignore_errors=True)

            fixturedef.addfinalizer(remove_unless_failed)


FLOAT32_EPS = torch.finfo(torch.float32).eps  # 2**-23 = 1.19e-7: one float32 rounding, relative


def loglik_tolerance(n_tokens: int, vocab_size: int = 50257) -> float:
    """The largest gap allowed between two float32 scorings of a sum of n_tokens log-probs that
    differ only in batch shape, kernel or code path (log_softmax vs gather - logsumexp).

    Each token's log-prob z_t - logsumexp(z) is a float32 number of size ln(V) (10.8 for GPT-2's
    vocabulary: the test models are random-init, so their softmax is near uniform); one rounding
    there is eps*ln(V) = 1.3e-6. Each path rounds the log-sum-exp and the difference; 4 roundings
    per token for the pair of paths also covers the logits' own GEMM-order error (|z| ~ 0.1, far
    smaller). Tokens add with no cancellation assumed. A wrong, missing or shifted token moves
    the sum by ~0.1 or more, far above this."""
    return 4 * FLOAT32_EPS * math.log(vocab_size) * n_tokens


def shared_data_dir() -> Path | None:
    env = os.environ.get("PRISM_SHARED_DATA")
    if env and Path(env).is_dir():
        return Path(env)
    guess = Path(__file__).resolve().parents[2] / "shared" / "data"
    return guess if guess.is_dir() else None


@pytest.fixture
def one_thread():
    """Tiny matrices on a shared 2-core machine: one thread avoids OpenMP contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def shared_data() -> Path:
    path = shared_data_dir()
    if path is None:
        pytest.skip("real test data not found: set PRISM_SHARED_DATA to the shared data folder")
    return path


def tiny_model(
    heads=(1, 2, 4, 4), d_model=64, h_base=4, seq_len=64, vocab_size=512, seed=0, **kw
) -> PrismDecoder:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        n_layer=len(heads),
        d_model=d_model,
        h_base=h_base,
        heads=list(heads),
        seq_len=seq_len,
        vocab_size=vocab_size,
        **kw,
    )
    return PrismDecoder(cfg)


def side_by_side(*procs: subprocess.Popen, timeout: float) -> list[subprocess.CompletedProcess]:
    """Wait for processes started together (started with stdout/stderr pipes), their pipes drained
    in parallel so that no process stalls on a full one; if waiting fails, none is left running.
    Independent runs side by side cost less wall time on 2 cores: Lightning starts a run's rank 1
    only once rank 0 is set up, so one core idles through each run's start-up."""
    try:
        with ThreadPoolExecutor(len(procs)) as pool:
            outs = list(pool.map(lambda p: p.communicate(timeout=timeout), procs))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return [subprocess.CompletedProcess(p.args, p.returncode, o, e) for p, (o, e) in zip(procs, outs)]


# ----- runs that several test modules compare with: each trained once per session ------------------
@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """test_train.py's shrunken tiny Prism run, uninterrupted, as one process (this one): what the
    resume tests (test_train, test_checkpoints) and the multi-process runs (DDP, torchrun) must
    reproduce. Read-only for the tests that use it. It logs to a CSV file too (the loggers are not
    part of a run's identity), so that test_train reads its steps in both; what Lightning logged
    and every warning raised during it are kept ("log", "warnings")."""
    import logging
    import warnings

    from test_train import Recorder, small

    from prism.train.trainer import train

    runs = tmp_path_factory.mktemp("runs")
    cfg, rec = small(runs, "schedule=prism", "train.loggers=[tensorboard,csv]"), Recorder()
    said: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: said.append(record.getMessage())
    lightning_log = logging.getLogger("lightning.pytorch")  # the root of Lightning's own loggers
    lightning_log.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")  # each one, even if raised earlier in the session
            out = train(cfg, extra_callbacks=[rec])
    finally:
        lightning_log.removeHandler(handler)
    return {
        "runs": runs,
        "out": out,
        "rec": rec,
        "summary": json.loads((out / "train_summary.json").read_text()),
        "log": said,
        "warnings": [f"{w.category.__name__}: {w.message}" for w in warned],
    }


@pytest.fixture(scope="session")
def ddp_reference(tmp_path_factory):
    """The same run as two gloo DDP processes that reproduce/train.py starts (Lightning's own
    launcher; 2 ranks x micro_batch 2 x accumulation 1), one OpenMP thread each, with non-default
    DDP settings (they change bucketing, never the summed gradients). test_train compares it with
    the one-process reference, test_fsdp with FSDP. Returns its train_summary.json."""
    from test_train import SMALL

    runs = tmp_path_factory.mktemp("ddp")
    cmd = [
        sys.executable,
        str(ROOT / "reproduce" / "train.py"),
        *("--scale", "tiny", "--schedule", "prism", "--seed", "0"),
        *SMALL,
        f"runs_dir={runs}",
        "train.accelerator=cpu",
        "train.devices=2",
        "train.strategy=ddp",
        "train.ddp_bucket_cap_mb=1",
        "train.ddp_static_graph=true",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=runs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((runs / "tiny" / "prism" / "seed0" / "train_summary.json").read_text())


# ----- a Lightning harness for the data stream ----------------------------------------------------
def stream_resume_through_lightning(
    tmp_path, datamodule, steps: int, stop: int, val_every: int, val_batches: int, keep=slice(None)
):
    """Train a do-nothing model on the data module's stream for `steps` steps; separately train
    `stop` steps with a checkpoint there and resume it to `steps`. Returns (the first run's
    batches, the interrupted run's, the resumed run's, the checkpoint's data state). Validation
    runs in between, so it is proven not to move the training stream."""
    import lightning as L

    from prism.data import data_state

    class Recording(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50257, 4)
            self.seen = []

        def training_step(self, batch, _):
            x, y = batch
            self.seen.append(x[:, keep].clone())
            return self.emb(x).mean() + 0 * y.sum()

        def validation_step(self, batch, _):
            self.log("val", self.emb(batch[0]).mean())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    def trainer(max_steps, **kw):
        return L.Trainer(
            max_steps=max_steps,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=val_batches,
            val_check_interval=val_every,
            default_root_dir=tmp_path,
            **kw,
        )

    full, first, resumed = Recording(), Recording(), Recording()
    trainer(steps, enable_checkpointing=False).fit(full, datamodule=datamodule())
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=stop, save_top_k=-1)
    trainer(stop, callbacks=[ckpt]).fit(first, datamodule=datamodule())
    path = next(tmp_path.glob(f"*step={stop}*.ckpt"))
    state = data_state(torch.load(path, weights_only=True))  # plain containers only
    trainer(steps).fit(resumed, datamodule=datamodule(), ckpt_path=path)
    return full.seen, first.seen, resumed.seen, state
