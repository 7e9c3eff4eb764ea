import pytest

from prism.core.schedule import (
    HeadSchedule,
    ModelShape,
    ScheduleError,
    ScheduleFilter,
    compact_text,
    count_schedules,
    iter_schedules,
    parse_heads,
)

SMALL = ModelShape(12, 768, 12)


def test_three_input_forms_agree():
    as_list = HeadSchedule((3, 3, 6, 6, 8, 8, 12, 12, 12, 12, 12, 12), SMALL)
    assert HeadSchedule.from_text("3x2,6x2,8x2,12x6", SMALL).heads == as_list.heads
    assert HeadSchedule.from_text("3,3,6,6,8,8,12x6", SMALL).heads == as_list.heads
    assert HeadSchedule.from_text("3×2, 6*2, 8x2, 12x6", SMALL).heads == as_list.heads
    named = HeadSchedule.resolve("prism", SMALL, {"prism": "3x2,6x2,8x2,12x6"})
    assert named.heads == as_list.heads and named.name == "prism"
    assert as_list.head_dims == (256, 256, 128, 128, 96, 96) + (64,) * 6
    assert compact_text(as_list.heads) == "3x2,6x2,8x2,12x6"


def test_uniform_by_name():
    s = HeadSchedule.resolve("uniform", SMALL)
    assert s.heads == (12,) * 12 and s.is_uniform and s.diagnostics() == []


@pytest.mark.parametrize(
    "heads, needle",
    [
        ("5,12x11", "layer 0: 5 heads does not divide d_model=768"),  # divisibility
        ("3,3,6,6,8,7,12x6", "layer 5: 7 heads"),  # divisibility, later layer
        ("6,3,12x10", "layer 1: 3 heads after 6 at layer 0 breaks monotonicity"),
        ("3x2,6x2,8x8", "layer 11: the last layer has 8 heads but must have h_base=12"),
        ("3x2,6x2,24x8", "layer 11: the last layer has 24 heads"),  # monotone and divides, so boundary
        ("3x2,12x9", "has 11 layers but the model has n_layer=12"),
    ],
)
def test_invalid_schedules_name_layer_and_value(heads, needle):
    with pytest.raises(ScheduleError) as err:
        HeadSchedule.from_text(heads, SMALL)
    assert needle in str(err.value)


def test_odd_head_dim_rejected_for_rope():
    with pytest.raises(ScheduleError, match="layer 0: 3 heads gives head dim 5"):
        HeadSchedule.from_text("3,15", ModelShape(2, 15, 15))


@pytest.mark.parametrize("text", ["", "3x", "x2", "3,,12", "0x2,12x10", "3x0,12x12", "a,b"])
def test_bad_text_is_one_clear_error(text):
    with pytest.raises(ScheduleError) as err:
        parse_heads(text)
    assert "\n" not in str(err.value)


def test_unknown_name_lists_valid_names():
    with pytest.raises(ScheduleError, match="unknown schedule 'prsm'.*uniform, prism"):
        HeadSchedule.resolve("prsm", SMALL, {"prism": "3x2,6x2,8x2,12x6"})


def test_design_rule_diagnostics():
    rules = lambda text: {d.rule for d in HeadSchedule.from_text(text, SMALL).diagnostics()}
    assert rules("3x2,6x2,8x2,12x6") == {"power_of_two_head_dim"}  # d_h 96 (info only)
    assert rules("3x2,6x2,12x8") == set()  # Config-6
    assert "staircase_smoothness" in rules("3,6,8,12x9")  # Config-1 single steps
    assert "flash_head_dim" in rules("2x2,4x2,8x2,12x6")  # Config-7, d_h = 384
    assert "baseline_preservation" in rules("3x4,6x4,12x4")  # only 4 of 12 at h_base
    smooth = HeadSchedule.from_text("3,6,8,12x9", SMALL).diagnostics()
    assert [d.layers for d in smooth if d.rule == "staircase_smoothness"] == [(0,), (1,), (2,)]
    assert all(d.severity in ("info", "warning") for d in smooth)


def brute_force(shape, rules):
    """Every head tuple by exhaustive product, filtered by validity and rules: the oracle."""
    import itertools

    out = []
    for heads in itertools.product(range(1, shape.h_base + 1), repeat=shape.n_layer):
        try:
            s = HeadSchedule(heads, shape)
        except ScheduleError:
            continue
        diag = {d.rule for d in s.diagnostics()}
        if rules.smooth and "staircase_smoothness" in diag:
            continue
        if rules.baseline_preservation and "baseline_preservation" in diag:
            continue
        if rules.power_of_two and "power_of_two_head_dim" in diag:
            continue
        if rules.max_head_dim and max(s.head_dims) > rules.max_head_dim:
            continue
        out.append(heads)
    return sorted(out)


@pytest.mark.parametrize(
    "rules",
    [
        ScheduleFilter(),
        ScheduleFilter(smooth=True),
        ScheduleFilter(baseline_preservation=True, power_of_two=True),
        ScheduleFilter(smooth=True, max_head_dim=32),
    ],
)
def test_enumeration_matches_brute_force(rules):
    shape = ModelShape(6, 96, 6)
    got = sorted(s.heads for s in iter_schedules(shape, rules))
    assert got == brute_force(shape, rules)
    assert count_schedules(shape, rules) == len(got)
    assert len(set(got)) == len(got)


def test_enumeration_is_lazy_for_huge_spaces():
    shape = ModelShape(24, 1536, 16)
    assert count_schedules(shape) > 1_000_000
    it = iter_schedules(shape)
    first = next(it)
    assert first.is_uniform  # uniform comes first; nothing else was built
    paper = (6,) * 3 + (12,) * 3 + (16,) * 18
    rules = ScheduleFilter(smooth=True, baseline_preservation=True, power_of_two=False, max_head_dim=256)
    assert any(s.heads == paper for s in iter_schedules(shape, rules))
