"""Any scale (docs/scales.md): the Prism rule reproduces Table 4 and obeys §2.1-2.3 at every shape,
a scale file without `schedules.prism` gets the rule's, one that breaks §2.1 is refused, scales
order by size, and the ladder's rungs follow its LR and token rules."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from prism.config.describe import by_size, count_params
from prism.config.ladder import TOKENS_PER_PARAM_RANGE, ladder_scales, peak_lr, training_tokens
from prism.config.schema import ConfigError, load_config
from prism.core.schedule import HeadSchedule, ModelShape, parse_heads, prism_rule
from prism.report.build import default_scales

ROOT = Path(__file__).resolve().parents[1]
TABLE4 = OmegaConf.to_container(OmegaConf.load(ROOT / "paper_tables" / "table4.yaml"))["schedules"]
PAPER_SHAPES = {"124m": (12, 768, 12), "354m": (24, 1024, 16), "757m": (24, 1536, 16)}


@pytest.mark.parametrize("scale", sorted(PAPER_SHAPES))
def test_the_rule_reproduces_table4_exactly(scale):
    sched = prism_rule(ModelShape(*PAPER_SHAPES[scale]))
    assert list(sched.heads) == parse_heads(TABLE4[scale]["heads"])
    assert list(sched.head_dims) == parse_heads(TABLE4[scale]["head_dims"])
    assert sched.name == "prism"
    # and it is the schedule the scale's config holds
    assert load_config(scale).head_schedule("prism").heads == sched.heads


def test_the_rule_gives_the_schedule_tiny_writes_out():
    cfg = load_config("tiny")
    assert prism_rule(cfg.shape).text() == cfg.schedules["prism"] == "1x2,2x2,4x4"


def _sweep() -> list[ModelShape]:
    shapes = []
    for d_model in range(64, 4097, 64):
        for head_dim in (64, 128):
            if d_model % head_dim == 0:
                shapes += [ModelShape(n, d_model, d_model // head_dim) for n in range(4, 49)]
    return shapes


def test_the_rule_obeys_the_constraints_and_design_rules_at_every_shape():
    shapes = _sweep()
    assert len(shapes) > 4000
    for shape in shapes:
        sched = prism_rule(shape)  # a HeadSchedule validates §2.1 when it is built
        HeadSchedule(sched.heads, shape).validate()
        warnings = [d.message for d in sched.diagnostics() if d.severity == "warning"]
        assert warnings == [], (shape, sched.text(), warnings)
        assert max(sched.head_dims) <= 256
        assert sum(h == shape.h_base for h in sched.heads) >= shape.n_layer / 2
        # uniform only where no power-of-two d_h wider than the baseline's, up to 256, divides
        # d_model (d_model an odd multiple of the baseline d_h): with L >= 4 one phase always fits
        wider = [dh for dh in (128, 256) if dh > shape.d_model // shape.h_base and shape.d_model % dh == 0]
        assert sched.is_uniform == (not wider), (shape, sched.text())


@pytest.mark.parametrize(
    "shape,heads",
    [
        ((3, 768, 12), "12x3"),  # no phase of 2 layers fits in floor(L/2) = 1
        ((8, 768, 12), "3x2,6x2,12x4"),  # the bridge goes first
        ((4, 768, 12), "6x2,12x2"),  # then the widest phase
        ((12, 576, 9), "9x12"),  # neither 256 nor 128 divides 576
        ((48, 1024, 16), "4x4,8x4,16x40"),  # p = 4 at most
    ],
)
def test_the_rule_shortens_then_drops_phases_to_keep_half_the_layers_at_h_base(shape, heads):
    assert prism_rule(ModelShape(*shape)).text() == heads


def _config_dir(tmp_path: Path, scale_yaml: str) -> Path:
    d = tmp_path / "configs"
    shutil.copytree(ROOT / "configs", d)
    (d / "scale" / "mine.yaml").write_text(scale_yaml)
    return d


def test_a_scale_file_without_a_prism_schedule_gets_the_rule(tmp_path):
    d = _config_dir(
        tmp_path,
        "model: {n_layer: 16, d_model: 2048, h_base: 16}\n"
        "train: {tokens: 4096, global_batch_tokens: 2048, lr: 1e-3}\n",
    )
    cfg = load_config("mine", config_dir=d)
    assert cfg.schedules["prism"] == prism_rule(ModelShape(16, 2048, 16)).text() == "8x2,16x14"
    assert cfg.head_schedule("prism").name == "prism"
    # an override of the shape gets the rule of the shape it asks for
    cfg = load_config("mine", ["model.n_layer=24"], config_dir=d)
    assert cfg.schedules["prism"] == "8x3,16x21"


@pytest.mark.parametrize(
    "prism,needle",
    [
        ("12x2,6x4,12x6", "layer 2: 6 heads after 12 at layer 1 breaks monotonicity (§2.1)"),
        ("5x2,12x10", "layer 0: 5 heads does not divide d_model=768 (divisibility, §2.1)"),
        ("3x2,6x10", "the last layer has 6 heads but must have h_base=12 (boundary convergence, §2.1)"),
        ("3x2,12x6", "has 8 layers but the model has n_layer=12"),
    ],
)
def test_a_scale_file_whose_prism_schedule_breaks_2_1_is_refused_in_one_sentence(tmp_path, prism, needle):
    d = _config_dir(
        tmp_path,
        "model: {n_layer: 12, d_model: 768, h_base: 12}\n"
        f"schedules: {{prism: '{prism}'}}\n"
        "train: {tokens: 4096, global_batch_tokens: 2048, lr: 1e-3}\n",
    )
    with pytest.raises(ConfigError) as err:
        load_config("mine", config_dir=d)
    text = str(err.value)
    assert text.startswith("schedule is invalid: ") and needle in text
    assert "\n" not in text and text.count(". ") == 0


def test_scales_order_by_parameter_count_and_the_report_lists_those_that_ran(tmp_path):
    assert by_size(["757m", "30m", "124m", "tiny", "354m", "82m", "51m"]) == [
        "tiny",
        "30m",
        "51m",
        "82m",
        "124m",
        "354m",
        "757m",
    ]
    runs, results = tmp_path / "runs", tmp_path / "results"
    assert default_scales(runs, results) == ["124m", "354m", "757m"]  # the paper's, always
    (runs / "51m").mkdir(parents=True)
    (results / "tiny").mkdir(parents=True)
    (results / "1b").mkdir()  # no configs/scale/1b.yaml: not a scale
    assert default_scales(runs, results) == ["tiny", "51m", "124m", "354m", "757m"]


def test_the_ladder_rules():
    assert [peak_lr(n) for n in (124_000_000, 29_938_560, 756_819_456)] == [6.0e-4, 1.2e-3, 2.4e-4]
    assert training_tokens(29_938_560, 262_144) == 2_855 * 262_144


@pytest.mark.parametrize("scale", [s for s in ladder_scales("paper") if s not in PAPER_SHAPES])
def test_every_ladder_rung_follows_the_rules(scale):
    cfg = load_config(scale)
    n = count_params(cfg)
    assert scale == f"{round(n / 1e6)}m"  # named by its size
    assert cfg.train.lr == peak_lr(n)
    assert cfg.train.tokens == training_tokens(n, cfg.train.global_batch_tokens)
    low, high = TOKENS_PER_PARAM_RANGE
    assert low <= cfg.train.tokens / n <= high
    assert cfg.head_schedule("prism").heads == prism_rule(cfg.shape).heads
    assert "prism" not in OmegaConf.load(ROOT / "configs" / "scale" / f"{scale}.yaml").get("schedules", {})
    # the family and recipe of 124m
    ref = load_config("124m")
    assert cfg.model.d_model // cfg.model.h_base == 64
    assert (cfg.model.seq_len, cfg.model.vocab_size) == (ref.model.seq_len, ref.model.vocab_size)
    assert (cfg.train.global_batch_tokens, cfg.data.subset) == (ref.train.global_batch_tokens, "sample-10BT")
