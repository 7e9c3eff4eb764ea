"""Every kind of part registers the same way (prism.registry.Registry): a tracker, a data source,
an evaluation task and a pipeline stage defined in this file, each one definition and one
registration line, take part in a tiny training run, the eval engine and a run_all plan exactly as the kit's
own do. Every registry refuses an unknown name in one sentence that lists the valid ones."""

from __future__ import annotations

import io
import json
import logging
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from lightning.pytorch.loggers import Logger
from rich.console import Console
from test_train import SMALL as TRAIN_SMALL

from prism.config.schema import DEFAULT_TASKS, load_config
from prism.config.values import KIT_STRATEGIES
from prism.data.heldout import Heldout, n_val_windows, split_heldout
from prism.data.source import WindowSource
from prism.data.sources import SOURCES
from prism.errors import ConfigError
from prism.eval import evaluate
from prism.eval.tasks import TASKS, EvalInputError, Task, choice_doc, resolve_tasks
from prism.pipeline.plan import assign_statuses, build_plan, default_scripts
from prism.pipeline.runner import execute
from prism.pipeline.stages import STAGES, Job, Phase, Placement, PlanContext, PlannedRun, Stage
from prism.registry import Registry
from prism.runs.records import Count, Record
from prism.train.plan import plan_run
from prism.train.strategy import STRATEGIES
from prism.train.trackers import TRACKERS, RunTrackers, TrackedRun, Tracker, TrackerState, check_trackers
from prism.train.trackers.build import open_csv
from prism.train.trainer import train

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "test-sentences"
# tests/test_train.py's 12-step run without its milestones, on this file's source
SMALL = [*(o for o in TRAIN_SMALL if not o.startswith("train.milestones")), f"data.source={SOURCE}"]


# ----- a tracker: one constructor, one registration line ---------------------------------------
class MemoryLogger(Logger):
    """A Lightning logger that keeps what it is given in memory, as a tracker's own logger does
    on its server."""

    def __init__(self, close_s: float = 0.0) -> None:
        super().__init__()
        self.metrics: list[tuple[int, dict]] = []
        self.hparams: dict = {}
        self.status: str | None = None
        self.close_s = close_s

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> str:
        return ""

    def log_metrics(self, metrics, step=None) -> None:
        self.metrics.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        self.hparams.update(params)

    def finalize(self, status: str) -> None:
        time.sleep(self.close_s)  # a server that is slow to take the end of a run
        self.status = status


OPENED: dict[str, MemoryLogger] = {}  # run folder -> the memory tracker's logger, for the test to read


def open_memory(run: TrackedRun, state: TrackerState) -> Logger:
    OPENED[str(run.out)] = MemoryLogger()
    return OPENED[str(run.out)]


# a remote tracker (on its own thread, as W&B and MLflow are) recording in memory
MEMORY = Tracker(open_memory, background=True)


def kept_in(loggers: list, close_s: float = 0.0, logger=MemoryLogger) -> Tracker:
    """A remote tracker kept by a test (not registered), whose loggers go to `loggers`."""

    def open_kept(run: TrackedRun, state: TrackerState) -> Logger:
        loggers.append(logger(close_s))
        return loggers[-1]

    return Tracker(open_kept, background=True)


@pytest.fixture
def memory_tracker():
    TRACKERS.add("memory", MEMORY)
    yield MEMORY
    TRACKERS.remove("memory")


# ----- a data source ---------------------------------------------------------------------------
ANIMALS = ("cat", "dog", "heron", "otter", "lynx", "crow", "newt", "mole")


class SentenceSource(WindowSource):
    """English sentences made here, tokenized in memory like data.source=offline's text."""

    def describe(self) -> str:
        return "sentences made by tests/test_extension.py"

    @staticmethod
    def documents() -> list[str]:
        return [
            f"Sentence {i}: the {ANIMALS[i % 8]} met the {ANIMALS[(3 * i + 1) % 8]} by the river "
            f"and they walked {i % 5 + 1} miles together before the sun went down."
            for i in range(300)
        ]

    def build_heldout(self, seq_len: int) -> Heldout:
        docs = self.documents()
        batches = (docs[i : i + 64] for i in range(0, len(docs), 64))
        n = n_val_windows(self.data.val_tokens, seq_len)
        held, _ = split_heldout(batches, n, seq_len + 1, self.where(), keep_rest=True)
        return held

    def train_arrays(self, heldout: Heldout) -> list:
        return [heldout.train_tokens]


@pytest.fixture(scope="module")
def sentence_source():
    SOURCES.add(SOURCE, SentenceSource)
    yield SOURCE
    SOURCES.remove(SOURCE)


def small(runs_dir, *extra):
    return load_config("tiny", [*SMALL, f"runs_dir={runs_dir}", *extra])


@pytest.mark.slow
def test_a_tracker_and_a_source_defined_here_take_part_in_a_tiny_run(
    sentence_source, memory_tracker, tmp_path
):
    from test_trackers import tensorboard_steps

    cfg = small(tmp_path / "runs", "train.loggers=[tensorboard,memory]")
    out = train(cfg)
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["data"] == {"source": SOURCE}  # what the run read: this file's sentences
    logger = OPENED[str(out)]
    assert logger.status == "success"  # closed by the run's end, on its own thread
    steps: dict[str, list[int]] = {}
    for step, metrics in logger.metrics:
        for key in metrics:
            steps.setdefault(key, []).append(step)
    # every metric at the steps TensorBoard holds it, once each
    assert steps == {k: sorted(v) for k, v in tensorboard_steps(out).items()}
    assert steps["train/loss"] == [2, 4, 6, 8, 10, 12] and steps["val/loss"] == [0, 6, 12]
    last_val = [m["val/loss"] for s, m in logger.metrics if "val/loss" in m][-1]
    assert last_val == pytest.approx(summary["final_val_loss"], rel=1e-6)
    # the run's identity beside the hyperparameters, as every tracker records it
    assert logger.hparams["config_hash"] == summary["config_hash"]
    assert logger.hparams["run_name"] == "tiny-prism-seed0" and logger.hparams["hardware"].startswith("CPU")
    state = json.loads((out / "trackers.json").read_text())
    assert state["floors"]["memory"]["train/loss"] == 12 and "memory" in state["hparams"]


@pytest.mark.slow
def test_remote_trackers_share_one_deadline_at_the_end(sentence_source, tmp_path, caplog):
    """Two remote trackers slow to close (5 s each) and a wait of 2 s: the end of the run waits
    2 s in all, not 2 s each, and names each of them once, neither as recording; the local CSV
    tracker is closed."""
    cfg = small(tmp_path / "runs", "train.tracker_wait_s=2")
    plan = plan_run(cfg)
    plan.out.mkdir(parents=True)
    # two remote trackers slower to close (5 s) than the run's whole wait
    trackers = {"csv": TRACKERS["csv"], "slow": kept_in([], 5.0), "slower": kept_in([], 5.0)}
    logger = RunTrackers(trackers, TrackedRun(cfg, plan), TrackerState(plan.out), wait_s=2)
    logger.begin(fresh=True)
    logger.log_metrics({"train/loss": 3.0}, step=1)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING):
        logger.finalize("success")
    assert time.monotonic() - t0 < 4
    assert [r.getMessage() for r in caplog.records if "tracker" in r.getMessage()] == [
        "slow tracker gave up (TimeoutError: it did not finish within 2 s (train.tracker_wait_s)); "
        "training continues, csv keeps recording.",
        "slower tracker gave up (TimeoutError: it did not finish within 2 s (train.tracker_wait_s)); "
        "training continues, csv keeps recording.",
    ]
    assert (plan.out / "csv" / "metrics.csv").read_text().splitlines() == ["step,train/loss", "1,3.0"]


SLEEP_S = 1.0  # each call to the slow tracker, its close too
STEPS = 6  # the slow tracker needs STEPS * SLEEP_S + SLEEP_S = 7 s for the run's calls and close
WAIT_S = 2 * SLEEP_S  # the end's one deadline: far too short for the slow one, ample for the other


class SleepyLogger(MemoryLogger):
    """A tracker's logger whose server takes SLEEP_S to answer each call, without failing."""

    def log_metrics(self, metrics, step=None) -> None:
        time.sleep(SLEEP_S)
        super().log_metrics(metrics, step)


@pytest.mark.slow
def test_a_slow_remote_tracker_delays_neither_the_calls_nor_the_close_of_another(
    sentence_source, tmp_path, caplog
):
    """A remote tracker that answers slowly without failing, listed first: the healthy one beside
    it still receives every step as it is logged and is closed at the end, within the one deadline;
    only the slow one is named as given up, once, and the line says the healthy one records."""
    cfg = small(tmp_path / "runs", f"train.tracker_wait_s={WAIT_S:g}")
    plan = plan_run(cfg)
    plan.out.mkdir(parents=True)
    slows, healthies = [], []
    trackers = {"slow": kept_in(slows, SLEEP_S, SleepyLogger), "healthy": kept_in(healthies)}
    logger = RunTrackers(trackers, TrackedRun(cfg, plan), TrackerState(plan.out), wait_s=WAIT_S)
    logger.begin(fresh=True)
    for step in range(STEPS):
        logger.log_metrics({"train/loss": float(step)}, step=step)
    # the healthy one is not behind the slow one's queue: it holds every step long before the slow
    # one could have taken them all (STEPS * SLEEP_S); polled, as its thread runs when it can
    until = time.monotonic() + STEPS * SLEEP_S / 2
    while len(healthies[0].metrics if healthies else []) < STEPS and time.monotonic() < until:
        time.sleep(0.01)
    [healthy], [slow] = healthies, slows
    assert [s for s, _ in healthy.metrics] == list(range(STEPS))
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING):
        logger.finalize("success")
    assert time.monotonic() - t0 < 3 * WAIT_S
    assert healthy.status == "success"  # closed, beside a close that never came
    assert healthy.metrics == [(s, {"train/loss": float(s)}) for s in range(STEPS)]
    got = [s for s, _ in slow.metrics]
    assert got == list(range(len(got))) and len(got) < STEPS and slow.status is None
    assert [r.getMessage() for r in caplog.records if "tracker" in r.getMessage()] == [
        f"slow tracker gave up (TimeoutError: it did not finish within {WAIT_S:g} s "
        f"(train.tracker_wait_s)); training continues, healthy keeps recording."
    ]


# ----- an evaluation task ----------------------------------------------------------------------
TASK = "echo_quiz"


def echo_doc(row: dict):
    return choice_doc(row["question"], row["choices"], int(row["label"]))


@pytest.fixture
def echo_task(tmp_path):
    """A multiple-choice task whose wrong answers are many words longer than the right one: an
    untrained model's summed log-likelihood prefers the short one, so acc is 1."""
    TASKS.add(
        TASK,
        Task(TASK, "multiple_choice", "nowhere/echo", None, "test", "echo/test.jsonl", echo_doc, ("acc",)),
    )
    rows = [
        {"question": f"Question {i}: say yes.", "choices": ["yes", "no " * 12], "label": 0} for i in range(3)
    ] + [{"question": "Question 3: say no.", "choices": ["maybe " * 12, "no"], "label": 1}]
    (tmp_path / "echo").mkdir()
    (tmp_path / "echo" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    yield tmp_path
    TASKS.remove(TASK)


def test_a_task_defined_here_is_scored_by_the_eval_engine(echo_task):
    model = tiny_model(heads=(2, 4), seq_len=64, vocab_size=50257, seed=0).eval()
    out = evaluate(model, [TASK], data_dir=echo_task, return_samples=True)
    assert out["tasks"][TASK] == {"acc": 1.0, "acc_stderr": pytest.approx(0.0), "n": 4}
    for sample in out["samples"][TASK]:
        assert max(range(2), key=lambda i: sample["lls"][i]) == sample["gold"]
    assert resolve_tasks(f"{TASK},blimp")[:2] == [TASK, "blimp_adjunct_island"]
    # the config's task lists accept it, as they accept the kit's own
    plan_run(load_config("tiny", [f"eval.tasks=[{TASK},piqa]"]), launch=False, reach_data=False)


# ----- a pipeline stage ------------------------------------------------------------------------
WORDCOUNT = """import json, sys
out = sys.argv[sys.argv.index("--out") + 1]
open(out, "w").write(json.dumps({"words": len(sys.argv[1:]), "argv": sys.argv[1:]}))
"""


class WordCountOutput(Record):
    words: Count


class WordCount(Stage):
    """Once per scale after the runs: a program that writes one JSON file, read through its record."""

    name = "wordcount"
    script = "wordcount.py"
    phase = Phase.after_runs
    placement = Placement.here
    output_record = WordCountOutput

    def jobs(self, ctx: PlanContext, run: PlannedRun | None) -> list[Job]:
        out = ctx.results / "wordcount.json"
        return [
            Job(
                self,
                "wordcount",
                out,
                {},
                ctx.logs / "wordcount.log",
                lambda: [*ctx.command(self), "--out", str(out)],
            )
        ]


@pytest.fixture
def wordcount_stage():
    STAGES.add(WordCount.name, WordCount())
    yield
    STAGES.remove(WordCount.name)


def test_a_stage_defined_here_is_planned_after_the_kits_and_runs(wordcount_stage, tmp_path):
    script = tmp_path / "wordcount.py"
    script.write_text(WORDCOUNT)
    scripts = {**default_scripts(ROOT / "reproduce"), "wordcount": str(script)}
    cfg = load_config("tiny", [f"runs_dir={tmp_path / 'runs'}", f"results_dir={tmp_path / 'results'}"])
    plan = build_plan(cfg, [], ["wordcount"], scripts, sys.executable)
    assert [j.label for j in plan.jobs][-3:] == ["analyze", "report", "wordcount"]  # registration order
    outcomes, failures = execute(assign_statuses(plan), Console(file=io.StringIO()))
    assert failures == [] and [(o.job.label, o.result) for o in outcomes] == [("wordcount", "ran")]
    out = tmp_path / "results" / "tiny" / "wordcount.json"
    assert json.loads(out.read_text()) == {"words": 2, "argv": ["--out", str(out)]}


# ----- refusals ----------------------------------------------------------------------------------
def one_sentence(text: str) -> bool:
    return text.endswith(".") and "\n" not in text and ". " not in text.replace("e.g. ", "")


@pytest.mark.parametrize(
    "registry, listed",
    [
        (SOURCES, ["hub", "local", "shards", "offline"]),
        (STAGES, ["train", "eval", "bench", "analyze", "report"]),
        (TASKS, list(DEFAULT_TASKS)),
        (TRACKERS, ["tensorboard", "csv", "wandb", "mlflow"]),
        (STRATEGIES, ["auto", "ddp", "fsdp", "ddp_spawn", "deepspeed"]),
    ],
    ids=lambda x: x.kind if isinstance(x, Registry) else "",
)
def test_every_registry_refuses_an_unknown_name_in_one_sentence_listing_the_valid_ones(registry, listed):
    with pytest.raises(ConfigError) as err:
        registry.get("nope")
    text = str(err.value)
    assert one_sentence(text) and "'nope'" in text, text
    valid = text.split(" are ", 1)[-1] if " are " in text else text.split("use one of ", 1)[-1]
    assert all(name in valid.replace(" or ", ", ").rstrip(".").split(", ") for name in listed), text
    assert "nope" not in registry


def test_the_refusals_a_user_meets_name_a_part_registered_here(sentence_source, memory_tracker, echo_task):
    with pytest.raises(ConfigError) as err:
        plan_run(load_config("tiny", ["data.source=ftp"]), launch=False, reach_data=False)
    assert (
        str(err.value) == f"data.source='ftp' is invalid: use one of hub, local, shards, offline, {SOURCE}."
    )
    with pytest.raises(EvalInputError) as err:
        resolve_tasks("hellaswagg")
    assert str(err.value) == (
        f"unknown task 'hellaswagg'; valid tasks are {', '.join(DEFAULT_TASKS)}, {TASK} or one BLiMP "
        f"paradigm as blimp_<UID> (e.g. blimp_adjunct_island)."
    )
    with pytest.raises(ConfigError) as err:
        check_trackers(load_config("tiny", ["train.loggers=[tensorboard,neptune]"]))
    assert str(err.value) == (
        "train.loggers=['tensorboard', 'neptune'] is invalid: give distinct names out of tensorboard, "
        "csv, wandb, mlflow, memory, e.g. [tensorboard,csv]."
    )
    check_trackers(load_config("tiny", ["train.loggers=[csv,memory]"]))
    assert STRATEGIES.names() == list(KIT_STRATEGIES)  # the config's copy, checked without Lightning


def test_a_name_is_registered_once():
    with pytest.raises(
        ValueError, match=r"^tracker 'csv' is already registered \(Tracker\); pass replace=True"
    ):
        TRACKERS.add("csv", MEMORY)
    with pytest.raises(ValueError, match="^stage 'train' is already registered"):
        STAGES.add("train", WordCount())
    assert TRACKERS.get("csv").open is open_csv
