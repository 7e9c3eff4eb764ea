"""The report trusts no input: real result files, damaged one at a time (by hand for each known
defect, and by hypothesis for any mutation of types, NaN/inf, negatives, missing keys,
truncation), give report.py's exit 0 or 1 with the file named, never a traceback; context
extensions are their own kind of run; a long-context loss never averages other documents.

The files are real: two cpu-s runs (uniform, prism; 4 steps each) and a context extension of the
prism run to 256 tokens, trained once per session; their long-context evaluation at 2x; and the
benchmark, analysis and zero-shot files the quick start wrote (examples/quickstart/tiny)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
import yaml
from conftest import load_script, shared_data_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prism.report import build_report
from prism.report.collect import collect

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart" / "tiny"
WIKITEXT = ("eval", "wikitext", "test.jsonl")
SCALE = "cpu-s"
RESULT_FILES = ("train_summary.json", "milestones.json", "config.yaml")

# CI runs the same examples every time: derandomized, bounded, no deadline (a report takes 1-3 s),
# no example database left in the checkout
settings.register_profile(
    "report-inputs",
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# ----- the real files, once per session -----------------------------------------------------------
@pytest.fixture(scope="session")
def real(tmp_path_factory) -> Path:
    """<root>/runs and <root>/results as the stages left them (run folders without weights,
    checkpoints and event files, which the report does not read)."""
    data = shared_data_dir()
    if data is None or not data.joinpath(*WIKITEXT).is_file():
        pytest.skip("real test data not found: set PRISM_SHARED_DATA to the shared data folder")
    from prism.config.schema import load_config
    from prism.train.trainer import train

    work = tmp_path_factory.mktemp("trained")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for schedule in ("uniform", "prism"):
            train(load_config(SCALE, [f"runs_dir={work}", f"schedule={schedule}", "data.val_tokens=512"]))
        source = work / SCALE / "prism" / "seed0"
        extension = [
            f"runs_dir={work}",
            "schedule=prism",
            "model.seq_len=256",
            "model.rope_scaling=linear",
            "model.rope_factor=2.0",
            "train.tokens=2048",
            "train.lr=1e-3",
            "train.warmup_frac=0.0",
            "train.milestones=[]",
            "data.val_tokens=512",
            f"train.init_from.run={source}",
        ]
        train(load_config(SCALE, extension))
        lc = load_script("long_context").main
        for schedule in ("uniform", "prism"):
            out = work / "results" / SCALE / "long_context" / schedule / "seed0.json"
            weights = work / SCALE / schedule / "seed0" / "model.safetensors"
            argv = ["--checkpoint", str(weights), "--out", str(out), "--device", "cpu", "--lengths", "2x"]
            argv += ["--path", str(data.joinpath(*WIKITEXT)), "--text-field", "page"]
            argv += ["long_context.source=path", "long_context.documents=2", "long_context.buckets=2"]
            assert lc([*argv, "long_context.rope_scalings=[none]"]) == 0
    finally:
        torch.set_num_threads(before)
    root = tmp_path_factory.mktemp("real")
    for run in sorted((work / SCALE).glob("*/seed*")):
        for name in RESULT_FILES:
            if (run / name).is_file():
                dest = root / "runs" / SCALE / run.parent.name / run.name / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(run / name, dest)
    results = root / "results" / SCALE
    shutil.copytree(work / "results" / SCALE, results)
    for name in ("bench.json", "analysis.json", "eval"):
        src = QUICKSTART / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, results / name)
    return root


def _tree(real: Path, dest: Path) -> tuple[Path, Path]:
    shutil.copytree(real, dest)
    return dest / "runs", dest / "results"


def report(runs: Path, results: Path, *extra: str) -> tuple[int, str, str]:
    """reproduce/report.py in this process: (exit code, stdout, stderr)."""
    main = load_script("report").main
    out, err = io.StringIO(), io.StringIO()
    argv = ["--scales", SCALE, "--runs-dir", str(runs), "--results-dir", str(results), *extra]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def _copy_seed(runs: Path, schedule: str, seed: int = 0, to: int = 1) -> Path:
    """Another seed of `schedule`: a copy of `seed`'s files whose summary names its new seed (a
    bare copy is refused as the same run counted twice)."""
    dest = runs / SCALE / schedule / f"seed{to}"
    shutil.copytree(runs / SCALE / schedule / f"seed{seed}", dest)
    _edit_json(dest / "train_summary.json", lambda d: d.update(seed=to))
    return dest


def _edit_json(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _left_out(err: str, path: Path) -> bool:
    return any(line.startswith(f"warning: {path} ") and "it is left out" in line for line in err.splitlines())


@pytest.mark.slow
def test_the_real_files_give_a_clean_report(real, tmp_path):
    runs, results = _tree(real, tmp_path / "t")
    rc, _, err = report(runs, results)
    assert (rc, err) == (0, "")
    text = (results / "RESULTS.md").read_text()
    assert "Problems found while reading results" not in text
    assert "| cpu-s | uniform |" in text and "| cpu-s | prism |" in text


# ----- each defect, by hand -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "key, value, said",
    [
        ("final_val_loss", math.nan, "has `final_val_loss` = nan, where a finite number belongs"),
        ("final_val_loss", math.inf, "has `final_val_loss` = inf, where a finite number belongs"),
        ("final_val_loss", "3.2", "has `final_val_loss` = '3.2', where a number ≥ 0 belongs"),
        ("final_val_loss", -7.43, "has `final_val_loss` = -7.43, where a number ≥ 0 belongs"),
        ("n_params", "123", "has `n_params` = '123', where an integer > 0 belongs"),
        ("tokens_seen", "4096", "has `tokens_seen` = '4096', where an integer > 0 belongs"),
        ("wall_clock_s", 0, "has `wall_clock_s` = 0, where a number > 0 belongs"),
    ],
)
@pytest.mark.slow
def test_a_damaged_summary_is_named_and_left_out(real, tmp_path, key, value, said):
    """Before: NaN crashed the Welch test, a string gave a TypeError, a negative loss made Δ
    −7.43, a zero wall clock was averaged into Table 2."""
    runs, results = _tree(real, tmp_path / "t")
    bad = runs / SCALE / "prism" / "seed0" / "train_summary.json"
    # a second, intact seed of each schedule, so that the Welch test and the means run
    for s in ("uniform", "prism"):
        _copy_seed(runs, s)
    _edit_json(bad, lambda d: d.update({key: value}))
    rc, _, err = report(runs, results)
    assert rc == 1, err
    assert err.splitlines()[0] == f"warning: {bad} {said.replace('`', '')}; it is left out."
    text = (results / "RESULTS.md").read_text()
    assert f"- `{bad}` {said}; it is left out." in text
    assert "−7.43" not in text and " nan " not in text.lower()
    assert sorted(collect(SCALE, runs, results).runs["prism"]) == [1]  # seed 1 alone remains


@pytest.mark.slow
def test_a_zero_throughput_is_not_averaged_into_table_2(real, tmp_path):
    runs, results = _tree(real, tmp_path / "t")
    _copy_seed(runs, "prism")
    bad = runs / SCALE / "prism" / "seed1" / "train_summary.json"

    def zero(d):
        d["throughput"]["tokens_per_s"] = 0
        d["wall_clock_s"] = 0

    _edit_json(bad, zero)
    rc, _, err = report(runs, results)
    assert rc == 1 and _left_out(err, bad), err
    res = collect(SCALE, runs, results)
    assert sorted(res.runs["prism"]) == [0]  # the damaged seed is in no mean


@pytest.mark.parametrize(
    "edit, said",
    [
        (lambda r: r.update(loss=math.nan), "has `results[0].loss` = nan, where a finite number belongs"),
        (lambda r: r.update(loss="2.1"), "has `results[0].loss` = '2.1', where a number ≥ 0 belongs"),
        (lambda r: r.update(loss=None), "has `results[0].loss` = None, where a number ≥ 0 belongs"),
        (lambda r: r["bucket_loss"].__setitem__(0, "x"), "has `results[0].bucket_loss[0]` = 'x'"),
    ],
)
@pytest.mark.slow
def test_a_damaged_long_context_result_is_named(real, tmp_path, edit, said):
    runs, results = _tree(real, tmp_path / "t")
    bad = results / SCALE / "long_context" / "prism" / "seed0.json"
    _edit_json(bad, lambda d: edit(d["results"][0]))
    rc, _, err = report(runs, results)
    assert rc == 1 and err.splitlines()[0].startswith(f"warning: {bad} {said.replace('`', '')}"), err
    assert f"- `{bad}` {said}" in (results / "RESULTS.md").read_text()


@pytest.mark.slow
def test_an_unfinished_long_context_evaluation_is_named(real, tmp_path):
    runs, results = _tree(real, tmp_path / "t")
    done = results / SCALE / "long_context" / "prism" / "seed0.json"
    partial = done.with_name("seed0.json.partial.json")
    done.rename(partial)
    rc, _, err = report(runs, results)
    assert rc == 1, err
    assert err.splitlines()[0] == (
        f"warning: {partial} is an unfinished long-context evaluation (no seed0.json yet; rerun its "
        "long_context.py command to finish it); it is left out."
    )


@pytest.mark.slow
def test_seeds_that_read_other_documents_are_not_averaged(real, tmp_path):
    """The whole-window loss table follows the Δ tables' rule: other documents, no mean."""
    runs, results = _tree(real, tmp_path / "t")
    lc = results / SCALE / "long_context" / "prism"
    shutil.copy(lc / "seed0.json", lc / "seed1.json")
    _edit_json(lc / "seed1.json", lambda d: d["results"][0]["documents"].update(sha256="0" * 64))
    rc, _, err = report(runs, results)
    assert (rc, err) == (0, "")
    text = (results / "RESULTS.md").read_text()
    assert "| prism | none | n/a (other documents) |" in text
    assert "| uniform | none | " in text and "| uniform | none | n/a" not in text


@pytest.mark.slow
def test_an_extension_is_no_schedule(real, tmp_path):
    """Before: rows `prism-ctx256` in Table 2, Tables 3 and 5 and equal compute; now the
    extension is listed in the long-context section with its source, context and budget."""
    runs, results = _tree(real, tmp_path / "t")
    assert (runs / SCALE / "prism-ctx256" / "seed0" / "train_summary.json").is_file()
    res = collect(SCALE, runs, results)
    assert set(res.runs) == {"uniform", "prism"} and "prism-ctx256" not in res.schedules()
    [ext] = res.extensions
    got = (ext.folder, ext.seed, ext.seq_len, ext.source_seq_len, ext.tokens)
    assert got == ("prism-ctx256", 0, 256, 128, 2048)
    rc, _, err = report(runs, results)
    assert (rc, err) == (0, "")
    text = (results / "RESULTS.md").read_text()
    before, beyond = text.split("## Beyond the training context")
    assert "ctx256" not in before
    assert (
        "- prism-ctx256 seed0: cpu-s/prism/seed0 (trained at 128 tokens) extended to 256 tokens for "
        f"2,048 tokens; final validation loss {ext.run.summary.final_val_loss:.4f} at 256 tokens."
    ) in beyond.splitlines()
    assert str(runs.parent) not in beyond and "/tmp" not in beyond  # no machine's path
    # its zero-shot scores go beside it, never into Table 3; scores of an extension with no run are named
    scores = results / SCALE / "eval" / "prism-ctx256"
    scores.mkdir(parents=True)
    shutil.copy(results / SCALE / "eval" / "prism" / "seed0.json", scores / "seed0.json")
    shutil.copy(results / SCALE / "eval" / "prism" / "seed0.json", scores / "seed1.json")
    _edit_json(scores / "seed1.json", lambda d: d.update(seed=1))  # another seed's scores, not a copy
    table3 = text.split("## Table 3")[1].split("\n## ")[0]
    rc, _, err = report(runs, results)
    assert rc == 1 and err.splitlines()[0] == (
        f"warning: {scores / 'seed1.json'}: zero-shot scores of the context extension prism-ctx256 seed1, "
        f"which has no finished run at {SCALE}; left out."
    ), err
    assert err.splitlines()[1].endswith(
        "leaves out the 1 file(s) named above; fix or move them and run "
        "again, or pass --allow-problems to accept the report without them."
    ), err
    text = (results / "RESULTS.md").read_text()
    assert text.split("## Table 3")[1].split("\n## ")[0] == table3
    line = next(
        x for x in text.split("## Beyond the training context")[1].splitlines() if "prism-ctx256" in x
    )
    assert line.endswith(
        "; zero-shot (at most 10 examples per task: not comparable to the paper's): hellaswag acc_norm "
        "30.0, piqa acc 30.0, winogrande acc 20.0, blimp acc 52.7, arc_easy acc 20.0, wikitext "
        "word_perplexity 22396.0."
    ), line


@pytest.mark.slow
def test_runs_of_one_schedule_with_other_budgets_are_a_mixed_recipe(real, tmp_path):
    """What Table 2 needs to refuse a mixed Δ, from real files: prism.report.recipes."""
    from prism.report.recipes import not_averaged, not_compared

    runs, results = _tree(real, tmp_path / "t")
    assert not_compared(collect(SCALE, runs, results), "prism", "uniform") is None
    _copy_seed(runs, "prism")
    cfg = runs / SCALE / "prism" / "seed1" / "config.yaml"
    doc = yaml.safe_load(cfg.read_text())
    doc["train"]["tokens"] = 8192
    cfg.write_text(yaml.safe_dump(doc))
    res = collect(SCALE, runs, results)
    assert not_averaged(res, "uniform") is None
    assert not_averaged(res, "prism") == (
        f"{SCALE} prism: not averaged, because `train.tokens` is 4096 in {SCALE}/prism/seed0 but 8192 in "
        f"{SCALE}/prism/seed1."
    )
    # nor are its long-context results averaged, or compared with uniform's, and the section says why
    lc = results / SCALE / "long_context" / "prism"
    shutil.copy(lc / "seed0.json", lc / "seed1.json")
    rc, _, err = report(runs, results)
    assert (rc, err) == (0, "")
    beyond = (results / "RESULTS.md").read_text().split("## Beyond the training context")[1]
    assert f"{SCALE} prism: not averaged, because `train.tokens` is 4096" in beyond
    assert "| prism | none | not averaged (see above) |" in beyond
    assert "not compared (see above)" in beyond and "p n/a" not in beyond.split("### ")[1]
    cfg.unlink()  # a run whose recipe is unknown is not held against the others
    assert not_averaged(collect(SCALE, runs, results), "prism") is None


@pytest.mark.slow
def test_a_scale_named_twice_is_refused(real, tmp_path):
    runs, results = _tree(real, tmp_path / "t")
    rc, _, err = report(runs, results, "--scales", SCALE, SCALE)
    assert rc == 2
    assert err.strip().splitlines() == [
        f"error: --scales names {SCALE!r} more than once; name each scale once."
    ]
    assert not (results / "RESULTS.md").exists()


# ----- any damage, by hypothesis ------------------------------------------------------------------
TARGETS = (
    "runs/cpu-s/prism/seed0/train_summary.json",
    "runs/cpu-s/uniform/seed0/milestones.json",
    "runs/cpu-s/prism/seed0/config.yaml",
    "runs/cpu-s/prism-ctx256/seed0/train_summary.json",
    "results/cpu-s/bench.json",
    "results/cpu-s/analysis.json",
    "results/cpu-s/eval/prism/seed0.json",
    "results/cpu-s/long_context/uniform/seed0.json",
)
NOT_FINITE = (math.nan, math.inf, -math.inf)
ODD_VALUES = st.one_of(
    st.sampled_from([*NOT_FINITE, -1, -0.5, 0, "text", "", None, True, [], {}, [1, "a"], {"a": math.nan}]),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
)


def _paths(doc, prefix=()) -> list[tuple]:
    """Every place in a document: the keys and indices leading to it."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:4]):  # the first few items show every shape
            out += _paths(v, (*prefix, i))
    return out


def _damaged(original: bytes, is_yaml: bool, kind: str, data) -> tuple[bytes, bool]:
    """The damaged bytes, and whether they must be left out whatever the report reads."""
    load = yaml.safe_load if is_yaml else json.loads
    dump = (lambda d: yaml.safe_dump(d, allow_unicode=True)) if is_yaml else (lambda d: json.dumps(d))
    doc = load(original.decode())
    if kind == "truncate":
        cut = data.draw(st.integers(min_value=0, max_value=len(original) - 1))
        return original[:cut], not is_yaml  # half a JSON object never parses
    if kind == "top-level":
        return dump(data.draw(st.sampled_from([[], [doc], 3, "text", None]))).encode(), True
    place = data.draw(st.sampled_from(_paths(doc)[1:]))
    *parent_keys, last = place
    parent = doc
    for k in parent_keys:
        parent = parent[k]
    if kind == "delete":
        parent.pop(last) if isinstance(parent, dict) else parent.pop(last)
        return dump(doc).encode(), False
    value = data.draw(ODD_VALUES)
    parent[last] = value
    not_finite = isinstance(value, float) and not math.isfinite(value)
    if is_yaml:  # YAML writes NaN as .nan: read back as NaN too
        return dump(doc).encode(), False
    return json.dumps(doc).encode(), not_finite


@settings(settings.get_profile("report-inputs"))
@given(st.data())
@pytest.mark.slow
def test_any_damage_to_a_real_file_is_a_sentence_never_a_traceback(real, data):
    target = data.draw(st.sampled_from(TARGETS), label="file")
    kind = data.draw(st.sampled_from(["set", "delete", "truncate", "top-level"]), label="damage")
    with tempfile.TemporaryDirectory() as tmp:
        runs, results = _tree(real, Path(tmp) / "t")
        path = Path(tmp) / "t" / target
        new, must_leave_out = _damaged(path.read_bytes(), path.suffix == ".yaml", kind, data)
        path.write_bytes(new)
        rc, _, err = report(runs, results)
        assert rc in (0, 1), err  # 70 and a traceback would be a bug
        assert "Traceback" not in err
        warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
        # the real files have no problem: whatever is named is the damaged file
        assert all(line.startswith(f"warning: {path} ") for line in warnings), err
        if must_leave_out:
            assert rc == 1 and _left_out(err, path), err
        if rc == 1:
            assert warnings and err.splitlines()[-1].startswith("error: "), err
            assert f"`{path}`" in (results / "RESULTS.md").read_text()


def test_the_validator_accepts_the_reports_own_fixtures():
    """The hand-written report fixtures (tests/fixtures/report) pass the validator unchanged."""
    fix = ROOT / "tests" / "fixtures" / "report"
    problems: list[str] = []
    build_report(["124m"], fix / "runs", fix / "results", problems=problems)
    assert problems == []
