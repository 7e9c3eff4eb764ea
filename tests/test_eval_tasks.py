"""Task definitions: hand-written fixture rows -> the exact requests and metrics the harness builds.

Expected strings are worked out by hand from each task's YAML in lm-evaluation-harness 0.4.x;
expected token ids are GPT-2 BPE ids, checked against the strings by decoding them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from prism.data.tokenizer import EOT_TOKEN, GPT2Tokenizer
from prism.eval.data import load_docs
from prism.eval.metrics import (
    aggregate_choice,
    aggregate_group,
    aggregate_rolling,
    choice_scores,
    mean_stderr,
)
from prism.eval.requests import TokenRequest, encode_pairs, rolling_windows
from prism.eval.tasks import TASKS, EvalInputError, resolve_tasks, wikitext_detokenize

FIXTURES = Path(__file__).parent / "fixtures" / "eval"


@pytest.fixture(scope="module")
def tok():
    return GPT2Tokenizer()


def requests_of(tok, doc):
    return encode_pairs(tok, list(zip(doc.contexts, doc.continuations)))


def check_ids(tok, req: TokenRequest, context: str, continuation: str):
    """The ids decode back to the two strings, so the split point is where we say it is."""
    assert tok.decode(req.context) == context
    assert tok.decode(req.continuation) == continuation


def test_hellaswag_cleans_brackets_and_titles(tok):
    doc = load_docs(TASKS["hellaswag"], FIXTURES)[0]
    # activity_label + ": " + ctx_a + " " + ctx_b.capitalize(), then "[header]" removed and
    # the double space it leaves collapsed.
    ctx = "Baking cookies: A woman mixes flour in a bowl. She"
    assert doc.contexts == (ctx,) * 4
    # "[title] eats the bowl." has no space before [title], so only the bracket goes: the
    # choice keeps a leading space and its continuation starts with two.
    assert doc.choices == ("puts the tray in the oven.", " eats the bowl.", "sings.", "paints the wall red.")
    assert doc.continuations == (
        " puts the tray in the oven.",
        "  eats the bowl.",
        " sings.",
        " paints the wall red.",
    )
    assert doc.gold == 0
    reqs = requests_of(tok, doc)
    assert reqs[0].context == (33, 868, 14746, 25, 317, 2415, 33237, 10601, 287, 257, 9396, 13, 1375)
    assert reqs[0].continuation == (7584, 262, 26473, 287, 262, 14361, 13)
    assert reqs[1].continuation == (220, 25365, 262, 9396, 13)  # " " then " eats"
    check_ids(tok, reqs[1], ctx, "  eats the bowl.")
    # Second row: empty ctx_b leaves a trailing space that the clean-up strips.
    doc2 = load_docs(TASKS["hellaswag"], FIXTURES)[1]
    assert doc2.contexts[0] == "Running: A man ties his shoes." and doc2.gold == 1


def test_piqa_prompt(tok):
    doc = load_docs(TASKS["piqa"], FIXTURES)[0]
    assert doc.contexts == ("Question: How do I boil water?\nAnswer:",) * 2
    assert doc.continuations == (" Heat it in a pot on the stove.", " Put it in the freezer.")
    assert doc.gold == 0
    req = requests_of(tok, doc)[1]
    assert req.context == (24361, 25, 1374, 466, 314, 20667, 1660, 30, 198, 33706, 25)
    assert req.continuation == (5930, 340, 287, 262, 30967, 13)
    check_ids(tok, req, "Question: How do I boil water?\nAnswer:", " Put it in the freezer.")


def test_arc_easy_three_and_five_choices_numeric_labels(tok):
    three, five = load_docs(TASKS["arc_easy"], FIXTURES)
    assert three.continuations == (" ice", " water", " steam") and three.gold == 1
    assert len(five.choices) == 5 and five.gold == 0  # answerKey "1" is label index 0
    reqs = requests_of(tok, three)
    assert [r.continuation for r in reqs] == [(4771,), (1660,), (13324,)]
    assert reqs[0].context == (24361, 25, 9022, 318, 257, 8122, 30, 198, 33706, 25)


def test_winogrande_partial_scoring(tok):
    doc = load_docs(TASKS["winogrande"], FIXTURES)[0]
    # The option fills the blank inside the context; only the shared suffix is scored.
    assert doc.contexts == ("The cup fell on the rug and the cup", "The cup fell on the rug and the rug")
    assert doc.continuations == (" broke.", " broke.")
    assert doc.gold == 0 and load_docs(TASKS["winogrande"], FIXTURES)[1].gold == 1
    a, b = requests_of(tok, doc)
    assert a.continuation == b.continuation == (6265, 13)
    assert a.context[-1] == 6508 and b.context[-1] == 14477  # " cup" vs " rug"
    assert TASKS["winogrande"].metrics == ("acc",)


def test_blimp_empty_context_uses_eot(tok):
    doc = load_docs(TASKS["blimp_adjunct_island"], FIXTURES)[1]
    assert doc.contexts == ("", "") and doc.gold == 0
    assert doc.continuations == (" The dogs bark.", " The dogs barks.")
    good, bad = requests_of(tok, doc)
    assert good == TokenRequest((EOT_TOKEN,), (383, 6844, 21405, 13))
    assert bad == TokenRequest((EOT_TOKEN,), (383, 6844, 2318, 591, 13))
    assert len(resolve_tasks("blimp")) == 67


def test_trailing_context_space_moves_into_continuation(tok):
    (req,) = encode_pairs(tok, [("The capital of France is ", "Paris")])
    check_ids(tok, req, "The capital of France is", " Paris")
    assert req.continuation == (6342,)  # " Paris" stays one token


def test_wikitext_detokenizer_and_counts():
    doc = load_docs(TASKS["wikitext"], FIXTURES)[0]
    assert doc.text == (
        " = Cats =\n\nThe cat-like dog, 1,000 years old (roughly).\n"
        "It was 20\u00b0warm; the cat's bowl held 3.5 kg.\n"
    )
    # Counted on the raw page: 34 whitespace-separated pieces plus the empty strings that
    # re.split leaves at the leading and trailing whitespace; "°" is two UTF-8 bytes.
    raw = (
        " = Cats = \n \n The cat @-@ like dog , 1 @,@ 000 years old ( roughly ) . \n"
        " It was 20 \u00b0 warm ; the cat 's bowl held 3 @.@ 5 kg . \n"
    )
    assert doc.words == 36 and doc.bytes == len(raw) + 1
    assert wikitext_detokenize(" = = = Heading = = = ") == " === Heading === "


def test_rolling_windows_by_hand():
    toks = list(range(1, 11))
    assert rolling_windows(toks, max_len=4, prefix_token=0) == [
        TokenRequest((0,), (1, 2, 3, 4)),  # first window conditions on EOT
        TokenRequest((4,), (5, 6, 7, 8)),  # full window: one token of context
        TokenRequest((6, 7, 8), (9, 10)),  # short last window: extra context
    ]
    lm_utils = pytest.importorskip("lm_eval.utils")
    for n in (1, 4, 5, 9, 13):
        for max_len in (1, 3, 4):
            ref = [
                lm_utils.make_disjoint_window(w)
                for w in lm_utils.get_rolling_token_windows(
                    list(range(1, n + 1)), prefix_token=0, max_seq_len=max_len, context_len=1
                )
            ]
            ours = rolling_windows(list(range(1, n + 1)), max_len, prefix_token=0)
            assert [(list(r.context), list(r.continuation)) for r in ours] == [
                (list(a), list(b)) for a, b in ref
            ]


def test_acc_and_acc_norm_by_hand():
    doc = load_docs(TASKS["piqa"], FIXTURES)[1]  # choices of 19 and 24 characters, gold 1
    assert [len(c) for c in doc.choices] == [19, 24]
    # -9.5 > -10.8 so acc picks choice 0 (wrong); per character -0.5 < -0.45, so acc_norm picks 1.
    assert choice_scores(doc, [-9.5, -10.8]) == {"acc": 0.0, "acc_norm": 1.0}
    # Ties go to the first choice, as np.argmax does in the harness.
    assert choice_scores(doc, [-3.0, -3.0])["acc"] == 0.0
    agg = aggregate_choice(
        [
            {"acc": 1.0, "acc_norm": 1.0},
            {"acc": 0.0, "acc_norm": 1.0},
            {"acc": 1.0, "acc_norm": 1.0},
            {"acc": 1.0, "acc_norm": 0.0},
        ],
        ("acc", "acc_norm"),
    )
    # mean 0.75; sample sd = sqrt((3 * 0.25^2 + 0.75^2) / 3) = 0.5; stderr = 0.5 / sqrt(4) = 0.25
    assert agg == {"acc": 0.75, "acc_stderr": 0.25, "acc_norm": 0.75, "acc_norm_stderr": 0.25, "n": 4}
    assert mean_stderr([1.0]) is None


def test_perplexities_and_group_by_hand():
    docs = load_docs(TASKS["wikitext"], FIXTURES)  # 36 + 14 words, 128 + 42 bytes
    out = aggregate_rolling(docs, [-100.0, -50.0])
    assert out["word_perplexity"] == pytest.approx(math.exp(150 / 50))
    assert out["byte_perplexity"] == pytest.approx(math.exp(150 / 170))
    assert out["bits_per_byte"] == pytest.approx(150 / 170 / math.log(2))
    group = aggregate_group(
        {"a": {"acc": 0.5, "acc_stderr": 0.3, "n": 10}, "b": {"acc": 1.0, "acc_stderr": 0.4, "n": 30}},
        ("acc",),
    )
    # unweighted mean of the two means; stderr sqrt(0.09 + 0.16) / 2 = 0.25
    assert group == {"acc": 0.75, "acc_stderr": pytest.approx(0.25), "n": 40}


@pytest.mark.parametrize(
    "row, message",
    [
        ({"goal": "g", "sol1": "a", "sol2": "b", "label": 2}, "gold label 2 is out of range for 2 choices"),
        ({"goal": "g", "sol1": "a", "sol2": "  ", "label": 0}, "choice 1 is empty"),
        ({"goal": "g", "sol1": "a", "label": 0}, "does not have the baber/piqa schema"),
    ],
)
def test_bad_rows_stop_with_one_sentence(tmp_path, row, message):
    import json

    (tmp_path / "piqa").mkdir()
    (tmp_path / "piqa" / "validation.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(EvalInputError) as err:
        load_docs(TASKS["piqa"], tmp_path)
    text = str(err.value)
    assert message in text and "row 0" in text and str(tmp_path) in text
    assert text.count(". ") == 0 and "\n" not in text


def test_unknown_task_and_missing_data(tmp_path):
    with pytest.raises(EvalInputError, match="unknown task 'hellaswagg'; valid tasks are hellaswag"):
        resolve_tasks("hellaswagg,piqa")
    with pytest.raises(EvalInputError, match=f"no data at {tmp_path}/arc_easy/test.jsonl"):
        load_docs(TASKS["arc_easy"], tmp_path)


def test_hub_loader_reads_the_hub_schema(tmp_path):
    """The hub code path (datasets.load_dataset by name and split) on a local folder holding
    files of the hub schema; with no hub and no such folder it names what it tried."""
    import dataclasses

    task = dataclasses.replace(TASKS["arc_easy"], hub_path=str(FIXTURES / "arc_easy"), hub_name=None)
    from prism.eval.data import read_hub_rows

    rows = read_hub_rows(task, limit=1)
    assert rows[0]["answerKey"] == "B"
    missing = dataclasses.replace(TASKS["arc_easy"], hub_path=str(tmp_path / "nowhere"))
    with pytest.raises(EvalInputError, match="could not load .*nowhere.* split test"):
        read_hub_rows(missing)


def test_limit_counts_or_fractions_like_the_harness():
    assert len(load_docs(TASKS["arc_easy"], FIXTURES, 1)) == 1
    assert len(load_docs(TASKS["arc_easy"], FIXTURES, 0.5)) == 1  # ceil(2 * 0.5)
    assert len(load_docs(TASKS["arc_easy"], FIXTURES, 0.51)) == 2  # ceil(1.02)
    for bad in (0, -3, 1.5):
        with pytest.raises(EvalInputError, match=f"limit {bad} is invalid"):
            load_docs(TASKS["arc_easy"], FIXTURES, bad)
