"""RoPE scaling as configuration (prism.core.rope, model.rope_scaling / rope_factor): each scaling
equals transformers' own implementation at Prism's head widths; at factor 1 every choice leaves the
model bit-identical to plain RoPE and the config hashes of existing runs unchanged; the decoder reads
inputs longer than seq_len without changing anything at seq_len or below; bad choices are refused
in one sentence; and an exported model carries the choice, giving the kit's logits and greedy
tokens at twice the training length."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from conftest import FLOAT32_EPS, load_script, tiny_model

from prism.config.schema import load_config
from prism.core import rope
from prism.core.model import ModelConfig, model_rope_cache, rope_cache
from prism.errors import ConfigError
from prism.runs.identity import config_hash, stable_hash, training_identity

transformers = pytest.importorskip("transformers", reason="transformers (the `hf` extra) is not installed")
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

HEAD_DIMS = (64, 128, 256)  # one Prism model at d_model = 768 holds all three (12, 6 and 3 heads)
FACTORS = (1.0, 2.0, 4.0, 8.0)
TRAIN_LEN = 1024
pytestmark = pytest.mark.usefixtures("one_thread")


def todays_tables(n: int, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoder's RoPE tables before scaling existed (model.py at the commit before it)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(n, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


# ----- each scaling equals transformers' ------------------------------------------------------
def hf_rope(head_dim: int, rope_parameters: dict, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """transformers' inverse frequencies and attention factor for one head width, from a
    LlamaConfig that states head_dim (so that hidden_size / heads is not what is read)."""
    config = LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=TRAIN_LEN,
        rope_parameters=dict(rope_parameters),
    )
    kwargs = {} if seq_len is None else {"seq_len": seq_len}
    return ROPE_INIT_FUNCTIONS[rope_parameters["rope_type"]](config, "cpu", **kwargs)


def assert_same_frequencies(got: torch.Tensor, want: torch.Tensor) -> None:
    """Float precision: the same float32 operations give the same bits (every case but one is
    exact); YaRN at factor 1, which the kit returns as plain RoPE while transformers blends
    equal frequencies through its ramp, differs by one rounding (2^-23 relative)."""
    assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=2 * FLOAT32_EPS, atol=0)


@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_linear_equals_transformers(base, head_dim, factor):
    got, attention = rope.rope_frequencies("linear", base, head_dim, TRAIN_LEN, factor)
    want, hf_attention = hf_rope(head_dim, {"rope_type": "linear", "rope_theta": base, "factor": factor})
    assert_same_frequencies(got, want)
    assert attention == hf_attention == 1.0


@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("base", [10000.0, 500.0])
@pytest.mark.parametrize("betas", [(32.0, 1.0), (16.0, 2.0)])
def test_yarn_equals_transformers(base, head_dim, factor, betas):
    beta_fast, beta_slow = betas
    got, attention = rope.rope_frequencies("yarn", base, head_dim, TRAIN_LEN, factor, beta_fast, beta_slow)
    want, hf_attention = hf_rope(
        head_dim,
        {
            "rope_type": "yarn",
            "rope_theta": base,
            "factor": factor,
            "original_max_position_embeddings": TRAIN_LEN,
            "beta_fast": beta_fast,
            "beta_slow": beta_slow,
        },
    )
    assert_same_frequencies(got, want)
    assert attention == pytest.approx(hf_attention, rel=1e-15)
    assert attention == pytest.approx(0.1 * math.log(factor) + 1.0, rel=1e-15)


@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_ntk_equals_transformers_dynamic_where_they_coincide(base, head_dim, factor):
    """transformers has no static NTK-aware scaling: its "dynamic" one grows the base by
    (factor * L / L0 - (factor - 1))^(d/(d-2)) for the current length L > L0. That term equals
    `factor` at L = L0 * (2 - 1/factor), an integer here (1024, 1536, 1792, 1920), so the kit's
    static base * factor^(d/(d-2)) is compared with transformers' "dynamic" evaluated at that
    length, and with transformers' formula at every other length through its plain default."""
    length = TRAIN_LEN * (2 - 1 / factor)
    assert length == int(length)
    got, attention = rope.rope_frequencies("ntk", base, head_dim, TRAIN_LEN, factor)
    params = {"rope_type": "dynamic", "rope_theta": base, "factor": factor}
    want, hf_attention = hf_rope(head_dim, params, seq_len=int(length))
    assert_same_frequencies(got, want)
    assert attention == hf_attention == 1.0
    # and not at another length: the comparison above is not vacuous
    other, _ = hf_rope(head_dim, params, seq_len=2 * TRAIN_LEN)
    assert factor == 1 or not torch.allclose(got, other, rtol=1e-4, atol=0)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_ntk_keeps_the_fastest_pair_and_slows_the_slowest_by_the_factor(head_dim):
    plain = rope.plain_inv_freq(10000.0, head_dim)
    got, _ = rope.ntk_scaling(10000.0, head_dim, TRAIN_LEN, 4.0)
    assert got[0] == plain[0] == 1.0
    assert float(plain[-1] / got[-1]) == pytest.approx(4.0, rel=1e-5)


# ----- factor 1: bit-identical to today ------------------------------------------------------
@pytest.mark.parametrize("scaling", sorted(rope.SCALINGS))
@pytest.mark.parametrize("head_dim", [*HEAD_DIMS, 16])
def test_factor_one_gives_todays_tables(scaling, head_dim):
    want = todays_tables(TRAIN_LEN, head_dim, 10000.0)
    got = rope_cache(TRAIN_LEN, head_dim, 10000.0, scaling=scaling, factor=1.0)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("scaling", sorted(rope.SCALINGS))
def test_factor_one_gives_todays_logits(scaling):
    """Mixed head widths 64, 32 and 16 in one model; the same seed gives the same weights."""
    x = torch.randint(0, 512, (2, 64), generator=torch.Generator().manual_seed(1))
    plain = tiny_model().eval()
    scaled = tiny_model(rope_scaling=scaling, rope_factor=1.0).eval()
    for a, b in zip(plain.blocks, scaled.blocks):
        want = todays_tables(64, a.attn.head_dim, 10000.0)
        assert torch.equal(b.attn.rope_cos, want[0]) and torch.equal(b.attn.rope_sin, want[1])
    with torch.no_grad():
        assert torch.equal(scaled(x), plain(x))


def test_none_ignores_the_factor():
    x = torch.randint(0, 512, (1, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(tiny_model(rope_factor=4.0).eval()(x), tiny_model().eval()(x))


def test_attention_factor_multiplies_both_tables():
    cos, sin = rope_cache(64, 32, 10000.0, scaling="yarn", factor=4.0, train_len=64)
    inv_freq, attention = rope.yarn_scaling(10000.0, 32, 64, 4.0)
    angles = torch.outer(torch.arange(64, dtype=torch.float32), inv_freq)
    assert attention > 1
    assert torch.equal(cos, angles.cos() * attention) and torch.equal(sin, angles.sin() * attention)


# ----- inputs longer than seq_len ------------------------------------------------------------
@pytest.mark.parametrize("scaling", sorted(rope.SCALINGS))
def test_long_inputs_get_tables_for_their_length_and_change_nothing_shorter(scaling):
    model = tiny_model(seq_len=32, rope_scaling=scaling, rope_factor=2.0).eval()
    buffers = [(b.attn.rope_cos.clone(), b.attn.rope_sin.clone()) for b in model.blocks]
    x = torch.randint(0, 512, (1, 128), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        short = model(x[:, :32])
        long = model(x)  # 4x the training length
        assert long.shape == (1, 128, 512) and torch.isfinite(long).all()
        assert torch.equal(model(x[:, :32]), short)
    for block, (cos, sin) in zip(model.blocks, buffers):
        assert block.attn.rope_cos.shape == (32, block.attn.head_dim // 2)
        assert torch.equal(block.attn.rope_cos, cos) and torch.equal(block.attn.rope_sin, sin)
        # the long tables are the scaled ones, for 128 positions
        long_cos, _ = block.attn.rope_tables(128)
        want, _ = model_rope_cache(model.cfg, block.attn.head_dim, 128)
        assert long_cos.shape == (128, block.attn.head_dim // 2) and torch.equal(long_cos, want)
    # causal: the first 32 logits of the long input only see the first 32 tokens (up to the
    # long tables' own roundings of the same angles)
    assert (long[:, :32] - short).abs().max().item() <= 64 * FLOAT32_EPS * max(1.0, short.abs().max().item())


def test_yarn_ramp_follows_the_pretrained_length_not_seq_len():
    """A context extension trains at a longer seq_len than its source: YaRN's ramp must stay
    where the source's length puts it (model.rope_train_len)."""
    extended = ModelConfig(seq_len=256, rope_scaling="yarn", rope_factor=2.0, rope_train_len=128)
    cos, _ = model_rope_cache(extended, 64)
    want, _ = rope_cache(256, 64, extended.rope_base, scaling="yarn", factor=2.0, train_len=128)
    assert torch.equal(cos, want)
    assert not torch.equal(
        cos, model_rope_cache(ModelConfig(seq_len=256, rope_scaling="yarn", rope_factor=2.0), 64)[0]
    )
    with pytest.raises(ValueError, match="model.rope_train_len=0 is invalid"):
        ModelConfig(rope_train_len=0)


def test_scaling_changes_the_model_only_when_asked():
    x = torch.randint(0, 512, (1, 64), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        plain = tiny_model().eval()(x)
        for scaling in ("linear", "ntk", "yarn"):
            assert not torch.allclose(tiny_model(rope_scaling=scaling, rope_factor=2.0).eval()(x), plain)


# ----- config: refusals and hashes -----------------------------------------------------------
@pytest.mark.parametrize(
    "override,says",
    [
        (
            "model.rope_scaling=dynamic",
            "model.rope_scaling='dynamic' is invalid: use one of none, linear, ntk, yarn.",
        ),
        ("model.rope_factor=0", "model.rope_factor=0.0 is invalid: use a positive factor"),
        ("model.rope_factor=-2", "model.rope_factor=-2.0 is invalid: use a positive factor"),
        ("model.rope_beta_slow=0", "model.rope_beta_slow=0.0 is invalid: it must be positive"),
        ("model.rope_factor=0.5", "model.rope_factor=0.5 is invalid: use a factor in [1, 64]: 1 reads"),
        ("model.rope_factor=1e9", "model.rope_factor=1000000000.0 is invalid: use a factor in [1, 64]"),
        ("long_context.rope_factor=100", "long_context.rope_factor=100.0 is invalid: use null (length"),
        # YaRN's ramp would run backwards: pairs kept and pairs interpolated swap
        (
            "model.rope_scaling=yarn model.rope_factor=2 model.rope_beta_fast=1 model.rope_beta_slow=32",
            "model.rope_beta_fast=1.0 is invalid: YaRN keeps pairs that turn more than rope_beta_fast",
        ),
        # the pretrained length places YaRN's ramp; no other choice reads it
        (
            "model.rope_scaling=linear model.rope_factor=2 model.rope_train_len=128",
            "model.rope_train_len=128 is invalid: only model.rope_scaling=yarn reads it (this run's is",
        ),
        ("model.rope_train_len=64", "model.rope_train_len=64 is invalid: only model.rope_scaling=yarn reads"),
        # d_model 8, tiny's prism heads 1, 2 and 4: widths 8, 4 and 2
        (
            "model.d_model=8 model.rope_scaling=ntk model.rope_factor=2",
            "model.rope_scaling=ntk cannot scale heads of width 2 (model.d_model / heads): NTK keeps",
        ),
    ],
)
def test_bad_choices_are_one_sentence(override, says):
    with pytest.raises(ConfigError) as exc:
        load_config("tiny", override.split())
    msg = str(exc.value)
    assert msg.startswith(says) and msg.endswith(".") and "\n" not in msg
    assert re.search(r"[.!?]\s+[A-Z]", msg) is None  # one sentence


def test_decoder_config_refuses_the_same():
    with pytest.raises(ValueError, match="use one of none, linear, ntk, yarn"):
        ModelConfig(rope_scaling="NTK")
    with pytest.raises(ValueError, match="use a positive factor"):
        ModelConfig(rope_factor=float("nan"))


def test_settings_that_compute_the_same_model_have_one_hash():
    """Any choice at factor 1 and `none` at any factor are plain RoPE; only YaRN reads the betas
    and the pretrained length. The tiny scale's hash is pinned (tests/test_identity.py too)."""
    plain = config_hash(load_config("tiny"))
    assert plain == "cd053005c4d02873"
    for same in (["model.rope_scaling=yarn"], ["model.rope_factor=3"], ["model.rope_scaling=ntk"]):
        assert config_hash(load_config("tiny", same)) == plain, same
    linear = ["model.rope_scaling=linear", "model.rope_factor=2"]
    assert config_hash(load_config("tiny", [*linear, "model.rope_beta_fast=8"])) == config_hash(
        load_config("tiny", linear)
    )
    yarn = ["model.rope_scaling=yarn", "model.rope_factor=2"]
    assert config_hash(load_config("tiny", [*yarn, "model.rope_train_len=64"])) != config_hash(
        load_config("tiny", yarn)
    )


def test_config_hash_is_unchanged_at_the_defaults_and_changed_by_a_choice():
    base = config_hash(load_config("tiny"))
    at_default = ["model.rope_scaling=none", "model.rope_factor=1.0", "model.rope_beta_fast=32"]
    assert config_hash(load_config("tiny", at_default)) == base
    # a run saved before the keys existed (its config.yaml has none of them) is the same run
    full = load_config("tiny")
    from prism.config.schema import to_dict

    saved = to_dict(full)
    for key in ("rope_scaling", "rope_factor", "rope_beta_fast", "rope_beta_slow", "rope_train_len"):
        del saved["model"][key]
    assert stable_hash(training_identity(saved)) == base
    chosen = {
        config_hash(load_config("tiny", over))
        for over in (
            ["model.rope_scaling=linear", "model.rope_factor=2"],
            ["model.rope_scaling=yarn", "model.rope_factor=2"],
            ["model.rope_scaling=yarn", "model.rope_factor=4"],
            ["model.rope_scaling=yarn", "model.rope_factor=4", "model.rope_beta_fast=16"],
        )
    }
    assert len(chosen) == 4 and base not in chosen


# ----- the export carries the choice ---------------------------------------------------------
def test_remote_code_computes_the_kits_frequencies():
    from prism.export.hf import rope_parameters
    from prism.export.remote.modeling_prism import rope_frequencies as remote

    for head_dim in HEAD_DIMS:
        for factor in (0.5, *FACTORS, 3.0):
            for scaling in rope.SCALINGS:
                cfg = ModelConfig(
                    seq_len=TRAIN_LEN, rope_scaling=scaling, rope_factor=factor, rope_beta_fast=24.0
                )
                want = rope.rope_frequencies(scaling, 10000.0, head_dim, TRAIN_LEN, factor, 24.0, 1.0)
                got = remote(10000.0, head_dim, rope_parameters(cfg) or {})
                assert torch.equal(got[0], want[0]) and got[1] == want[1], (scaling, head_dim, factor)


def kit_greedy(kit, prompt: list[int], steps: int) -> list[int]:
    seq = list(prompt)
    with torch.inference_mode():
        for _ in range(steps):
            seq.append(int(kit(torch.tensor([seq]))[0, -1].argmax()))
    return seq


@pytest.mark.parametrize("scaling", ["linear", "ntk", "yarn"])
@pytest.mark.slow
def test_exported_model_gives_the_kits_logits_at_twice_the_training_length(tmp_path, scaling):
    """A tiny Prism schedule with head widths 256, 128 and 64 (d_model 256, heads 1, 2, 4, 4),
    trained length 32, scaled by 2: the exported folder's config says so, and its logits over 64
    positions equal the kit's; greedy generation across the training length, with and without
    the KV cache, gives the kit's tokens."""
    from prism.core.model import VOCAB_SIZE
    from prism.export import export_hf
    from prism.runs.checkpoint import export_safetensors

    kit = tiny_model(
        heads=(1, 2, 4, 4),
        d_model=256,
        h_base=4,
        seq_len=32,
        vocab_size=VOCAB_SIZE,
        tie_embeddings=False,  # random untied weights: greedy paths move (a tied one copies)
        rope_scaling=scaling,
        rope_factor=2.0,
    ).eval()
    assert sorted({b.attn.head_dim for b in kit.blocks}) == [64, 128, 256]
    export_safetensors(kit, tmp_path / "weights")
    out = export_hf(tmp_path / "weights", tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    # the context trained at is the headline; the scaled read is its own, labelled setting
    assert config["max_position_embeddings"] == 32 and config["scaled_max_position_embeddings"] == 64
    card = " ".join((out / "README.md").read_text().split())
    assert "The context is 32 tokens, the length the weights were trained at." in card
    assert (
        "reads up to 64 positions (config.json's scaled_max_position_embeddings); positions past 32 " in card
    )
    assert not re.search(r"(?<![\d,.])64 tokens\b(?!/)", card)  # as a count of its own, not in 1,064 tokens/s
    assert config["rope_parameters"]["rope_type"] == scaling and config["rope_parameters"]["factor"] == 2.0
    if scaling == "yarn":
        assert config["rope_parameters"]["original_max_position_embeddings"] == 32
    hf = AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True, dtype=torch.float32).eval()
    x = torch.randint(0, VOCAB_SIZE, (2, 64), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        want, got = kit(x), hf(x, use_cache=False).logits
    # Same weights, tables built by the same float32 operations, the same SDPA call: in practice
    # bit-equal. Allowed: a few roundings of the largest logit (64 float32 epsilons, relative),
    # for kernels that may order their sums differently; a wrong frequency, attention factor or
    # table length moves the logits by orders of magnitude more (test_scaling_changes_the_model).
    assert got.shape == want.shape == (2, 64, VOCAB_SIZE)
    assert (got - want).abs().max().item() <= 64 * FLOAT32_EPS * max(1.0, want.abs().max().item())
    prompt = x[0, :28].tolist()  # 28 + 20 tokens: across the trained 32
    wanted = kit_greedy(kit, prompt, 20)
    assert len(set(wanted[28:])) > 5  # a path that moves
    for use_cache in (True, False):
        tokens = hf.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, use_cache=use_cache)
        assert tokens.tolist() == [wanted]


def test_export_without_scaling_is_unchanged(tmp_path):
    from prism.core.model import VOCAB_SIZE
    from prism.export import export_hf
    from prism.runs.checkpoint import export_safetensors

    kit = tiny_model(seq_len=32, vocab_size=VOCAB_SIZE)
    export_safetensors(kit, tmp_path / "weights")
    config = json.loads((export_hf(tmp_path / "weights", tmp_path / "hf") / "config.json").read_text())
    assert config["max_position_embeddings"] == 32 and "rope_parameters" not in config
    assert "scaled_max_position_embeddings" not in config
    assert "rope_scaling" not in config


def test_ntk_needs_two_pairs_per_head_and_is_plain_at_factor_1():
    """NTK keeps the fastest pair and slows the slowest by the factor: a head of width 2 has one
    pair, which cannot be both (and d/(d-2) divides by zero). At factor 1 it is plain RoPE at any
    width, as every choice is, so a model of such heads builds."""
    with pytest.raises(ValueError, match="cannot scale heads of width 2"):
        ModelConfig(n_layer=2, d_model=8, h_base=4, rope_scaling="ntk", rope_factor=2.0)
    plain, _ = rope_cache(16, 2, 10000.0)
    assert torch.equal(rope_cache(16, 2, 10000.0, scaling="ntk", factor=1.0)[0], plain)
    ModelConfig(n_layer=2, d_model=8, h_base=4, rope_scaling="ntk", rope_factor=1.0)
    ModelConfig(n_layer=2, d_model=16, h_base=4, rope_scaling="ntk", rope_factor=2.0)  # width 4: two pairs


def test_train_py_refuses_ntk_at_head_width_2_before_anything_is_written(tmp_path, capsys):
    argv = ["--scale", "tiny", "--schedule", "prism", "model.d_model=8", "model.rope_scaling=ntk"]
    argv += ["model.rope_factor=2", f"runs_dir={tmp_path / 'runs'}"]
    assert load_script("train").main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: model.rope_scaling=ntk cannot scale heads of width 2") and "\n" not in err
    assert not (tmp_path / "runs").exists()
