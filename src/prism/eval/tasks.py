"""The zero-shot tasks of the paper's Table 3 as lm-evaluation-harness 0.4.x defines them, one
declarative `Task` each (how each kind is scored: docs/evaluation.md, "Zero-shot evaluation")."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Union

from prism.config.schema import DEFAULT_TASKS, ConfigError, RunConfig
from prism.errors import PrismError
from prism.registry import Registry

SEMANTICS = "lm-evaluation-harness 0.4.x"
TARGET_DELIMITER = " "  # the harness's default target_delimiter, used by every task here


class EvalInputError(PrismError, ValueError):
    """Bad task name, missing data or a malformed row; the message is one sentence naming it."""


@dataclass(frozen=True)
class ChoiceDoc:
    """One multiple-choice document: request i is (contexts[i], continuations[i])."""

    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    choices: tuple[str, ...]  # doc_to_choice's strings; their lengths normalise acc_norm
    gold: int


@dataclass(frozen=True)
class RollingDoc:
    """One document scored as a whole (loglikelihood_rolling)."""

    text: str  # what is tokenised and scored (detokenised page)
    words: int  # word count of the original page
    bytes: int  # UTF-8 byte count of the original page


Doc = Union[ChoiceDoc, RollingDoc]


@dataclass(frozen=True)
class Task:
    name: str
    output_type: str  # "multiple_choice" | "loglikelihood_rolling"
    hub_path: str  # dataset_path in the harness YAML
    hub_name: str | None  # dataset_name
    split: str  # the split the harness evaluates
    local_file: str  # the same rows as JSON lines, relative to --data-dir
    to_doc: Callable[[dict], Doc]
    metrics: tuple[str, ...]
    group: str | None = None  # BLiMP paradigms aggregate into "blimp"


def _check_choices(choices: list[str], gold: int) -> None:
    for i, choice in enumerate(choices):
        if not isinstance(choice, str) or not choice.strip():
            raise EvalInputError(f"choice {i} is empty ({choice!r}); every choice needs text to score")
    if not 0 <= gold < len(choices):
        raise EvalInputError(
            f"gold label {gold} is out of range for {len(choices)} choices (valid: 0 to {len(choices) - 1})"
        )


def choice_doc(context: str, choices: list[str], gold: int) -> ChoiceDoc:
    """The usual layout: one shared context, the choices as continuations."""
    _check_choices(choices, gold)
    return ChoiceDoc(
        contexts=(context,) * len(choices),
        continuations=tuple(TARGET_DELIMITER + c for c in choices),
        choices=tuple(choices),
        gold=gold,
    )


def _int_label(value, what: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise EvalInputError(f"{what} {value!r} is not an integer label") from None


# ----- HellaSwag (lm_eval/tasks/hellaswag) -----------------------------------------------------
def hellaswag_clean(text: str) -> str:
    """The WikiHow bracket artefacts and title markers are removed the harness's way."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def hellaswag_doc(row: dict) -> ChoiceDoc:
    ctx = row["ctx_a"] + " " + row["ctx_b"].capitalize()
    query = hellaswag_clean(row["activity_label"] + ": " + ctx)
    return choice_doc(query, [hellaswag_clean(e) for e in row["endings"]], _int_label(row["label"], "label"))


# ----- PIQA (lm_eval/tasks/piqa) ---------------------------------------------------------------
def piqa_doc(row: dict) -> ChoiceDoc:
    return choice_doc(
        f"Question: {row['goal']}\nAnswer:", [row["sol1"], row["sol2"]], _int_label(row["label"], "label")
    )


# ----- ARC-Easy (lm_eval/tasks/arc/arc_easy.yaml) ---------------------------------------------
def arc_doc(row: dict) -> ChoiceDoc:
    labels, key = list(row["choices"]["label"]), row["answerKey"]
    if key not in labels:
        raise EvalInputError(f"answerKey {key!r} is not one of the choice labels {labels}")
    return choice_doc(
        f"Question: {row['question']}\nAnswer:", list(row["choices"]["text"]), labels.index(key)
    )


# ----- WinoGrande (lm_eval/tasks/winogrande/preprocess_winogrande.py) ------------------------
def winogrande_doc(row: dict) -> ChoiceDoc:
    sentence = row["sentence"]
    if "_" not in sentence:
        raise EvalInputError(f"sentence {sentence!r} has no '_' blank to fill")
    answer = {"1": 0, "2": 1}.get(str(row["answer"]))
    if answer is None:
        raise EvalInputError(f"gold label {row['answer']!r} is out of range (valid: '1' or '2')")
    blank = sentence.index("_")
    options = [row["option1"], row["option2"]]
    _check_choices(options, answer)
    contexts = [sentence[:blank] + opt for opt in options]  # the option goes into the context
    suffix = TARGET_DELIMITER + sentence[blank + 1 :].strip()  # only the shared suffix is scored
    return ChoiceDoc(
        contexts=tuple(contexts), continuations=(suffix, suffix), choices=tuple(contexts), gold=answer
    )


# ----- BLiMP (lm_eval/tasks/blimp/_template_yaml) ----------------------------------------------
def blimp_doc(row: dict) -> ChoiceDoc:
    return choice_doc("", [row["sentence_good"], row["sentence_bad"]], 0)


BLIMP_PARADIGMS = """
    adjunct_island anaphor_gender_agreement anaphor_number_agreement animate_subject_passive
    animate_subject_trans causative complex_NP_island
    coordinate_structure_constraint_complex_left_branch
    coordinate_structure_constraint_object_extraction determiner_noun_agreement_1
    determiner_noun_agreement_2 determiner_noun_agreement_irregular_1
    determiner_noun_agreement_irregular_2 determiner_noun_agreement_with_adj_2
    determiner_noun_agreement_with_adj_irregular_1
    determiner_noun_agreement_with_adj_irregular_2 determiner_noun_agreement_with_adjective_1
    distractor_agreement_relational_noun distractor_agreement_relative_clause drop_argument
    ellipsis_n_bar_1 ellipsis_n_bar_2 existential_there_object_raising
    existential_there_quantifiers_1 existential_there_quantifiers_2
    existential_there_subject_raising expletive_it_object_raising inchoative intransitive
    irregular_past_participle_adjectives irregular_past_participle_verbs
    irregular_plural_subject_verb_agreement_1 irregular_plural_subject_verb_agreement_2
    left_branch_island_echo_question left_branch_island_simple_question
    matrix_question_npi_licensor_present npi_present_1 npi_present_2 only_npi_licensor_present
    only_npi_scope passive_1 passive_2 principle_A_c_command principle_A_case_1
    principle_A_case_2 principle_A_domain_1 principle_A_domain_2 principle_A_domain_3
    principle_A_reconstruction regular_plural_subject_verb_agreement_1
    regular_plural_subject_verb_agreement_2 sentential_negation_npi_licensor_present
    sentential_negation_npi_scope sentential_subject_island superlative_quantifiers_1
    superlative_quantifiers_2 tough_vs_raising_1 tough_vs_raising_2 transitive wh_island
    wh_questions_object_gap wh_questions_subject_gap wh_questions_subject_gap_long_distance
    wh_vs_that_no_gap wh_vs_that_no_gap_long_distance wh_vs_that_with_gap
    wh_vs_that_with_gap_long_distance
""".split()


# ----- WikiText (lm_eval/tasks/wikitext/preprocess_wikitext.py) -------------------------------
_DETOKENIZE_STEPS: list[tuple[str, str, str]] = [  # (kind, pattern, replacement), in order
    ("str", "s '", "s'"),
    ("re", r"/' [0-9]/", r"/'[0-9]/"),
    *[("str", f" @{c}@ ", c) for c in "-,."],
    *[("str", f" {c} ", f"{c} ") for c in ":;.!?,"],
    *[  # the insides of brackets and quotes lose their padding
        ("re", rf"{re.escape(o)}\s*([^{re.escape(c)}]*?)\s*{re.escape(c)}", rf"{o}\1{c}")
        for o, c in ("()", "[]", "{}", '""', "''")
    ],
    *[("str", " ".join("=" * n), "=" * n) for n in (4, 3, 2)],
    ("str", " \u00b0 ", "\u00b0"),
    ("str", " \n", "\n"),
    ("str", "\n ", "\n"),
    ("str", " N ", " 1 "),
    ("str", " 's", "'s"),
]


def wikitext_detokenize(text: str) -> str:
    """Undo WikiText's tokenised spacing (" @-@ ", " , ", "( x )" ...) in the harness's order."""
    for kind, pattern, repl in _DETOKENIZE_STEPS:
        text = text.replace(pattern, repl) if kind == "str" else re.sub(pattern, repl, text)
    return text


def wikitext_doc(row: dict) -> RollingDoc:
    page = row["page"]
    if not isinstance(page, str) or not page:
        raise EvalInputError("page is empty; there is nothing to score")
    # Word and byte counts come from the page *before* detokenisation (the harness's rule).
    return RollingDoc(
        text=wikitext_detokenize(page), words=len(re.split(r"\s+", page)), bytes=len(page.encode("utf-8"))
    )


# ----- the registry ------------------------------------------------------------------------
ACC = ("acc",)
ACC_NORM = ("acc", "acc_norm")
PPL = ("word_perplexity", "byte_perplexity", "bits_per_byte")
MC = "multiple_choice"


def _listed_tasks(names: list[str]) -> str:
    """The valid task names as a refusal lists them: a group (blimp) once, not its members."""
    shown = dict.fromkeys(
        next((g for g, members in GROUPS.items() if name in members), name) for name in names
    )
    return f"{', '.join(shown)} or one BLiMP paradigm as blimp_<UID> (e.g. blimp_adjunct_island)"


def _task(name: str, hub_path: str, hub_name: str | None, split: str, to_doc, metrics) -> Task:
    """A task whose local rows are <name>/<split>.jsonl; the perplexity task is scored rolling."""
    output_type = "loglikelihood_rolling" if metrics == PPL else MC
    return Task(name, output_type, hub_path, hub_name, split, f"{name}/{split}.jsonl", to_doc, metrics)


# adding a task is one Task and one TASKS.add(task.name, task) line, here or in a site's code
TASKS: Registry[Task] = Registry("task", listed=_listed_tasks)
for _task_ in [
    _task("hellaswag", "Rowan/hellaswag", None, "validation", hellaswag_doc, ACC_NORM),
    _task("piqa", "baber/piqa", None, "validation", piqa_doc, ACC_NORM),
    _task("arc_easy", "allenai/ai2_arc", "ARC-Easy", "test", arc_doc, ACC_NORM),
    _task("winogrande", "allenai/winogrande", "winogrande_xl", "validation", winogrande_doc, ACC),
    *[
        Task(f"blimp_{u}", MC, "nyu-mll/blimp", u, "train", f"blimp/{u}.jsonl", blimp_doc, ACC, "blimp")
        for u in BLIMP_PARADIGMS
    ],
    _task("wikitext", "EleutherAI/wikitext_document_level", "wikitext-2-raw-v1", "test", wikitext_doc, PPL),
]:
    TASKS.add(_task_.name, _task_)
GROUPS: dict[str, list[str]] = {"blimp": [f"blimp_{uid}" for uid in BLIMP_PARADIGMS]}


def resolve_tasks(names: list[str] | str) -> list[str]:
    """Expand groups ("blimp" -> its 67 paradigms) and check every name, keeping order."""
    if isinstance(names, str):
        names = [n for n in names.split(",") if n.strip()]
    out: list[str] = []
    for raw in names:
        name = raw.strip()
        if name not in GROUPS and name not in TASKS:
            raise EvalInputError(TASKS.unknown(name))
        out += [m for m in GROUPS.get(name, [name]) if m not in out]
    if not out:
        raise EvalInputError(f"no task given; valid tasks are {', '.join(DEFAULT_TASKS)}.")
    return out


def check_task_config(cfg: RunConfig) -> None:
    """Refuse, naming the key, a task list of the config (eval.tasks, train.eval_tasks) that names
    no task or one this module does not define: before any step (prism.train.plan)."""
    for key, tasks in (("eval.tasks", cfg.eval.tasks), ("train.eval_tasks", cfg.train.eval_tasks)):
        try:
            resolve_tasks(list(tasks))
        except EvalInputError as exc:
            raise ConfigError(f"{key}={list(tasks)!r} is invalid: {exc}") from None
