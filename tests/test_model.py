import math

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model
from torch.utils.flop_counter import FlopCounterMode

from prism.config.schema import load_config
from prism.core.model import ModelConfig, PrismDecoder, apply_rope, flops_per_token

PAPER_SIZES = {"124m": 124e6, "354m": 354e6, "757m": 757e6}


def meta_model(scale: str, schedule: str) -> PrismDecoder:
    cfg = load_config(scale).model_config(schedule)
    with torch.device("meta"):
        return PrismDecoder(cfg)


@pytest.mark.parametrize("scale", ["tiny", "124m", "354m", "757m"])
def test_param_counts_identical_and_match_paper(scale):
    uniform, prism = meta_model(scale, "uniform"), meta_model(scale, "prism")
    assert uniform.cfg.heads != prism.cfg.heads
    assert uniform.num_params() == prism.num_params()
    assert [p.shape for p in uniform.parameters()] == [p.shape for p in prism.parameters()]
    if scale in PAPER_SIZES:
        assert abs(uniform.num_params() / PAPER_SIZES[scale] - 1) < 0.005


def count_train_flops(model: PrismDecoder, batch: int, seq: int) -> int:
    # On the meta device SDPA dispatches to ops the flop counter knows (the CPU flash kernel is
    # not registered there), and nothing is actually computed.
    idx = torch.randint(0, model.cfg.vocab_size, (batch, seq), device="meta")
    with FlopCounterMode(display=False) as counter:
        model(idx, idx).backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("scale", ["tiny", "124m"])
@pytest.mark.slow
def test_flops_identical_across_schedules_and_match_formula(scale):
    cfg = load_config(scale)
    T = cfg.model.seq_len
    measured = {
        name: count_train_flops(meta_model(scale, name), 1, T) for name in ["uniform", *cfg.schedules]
    }
    assert len(set(measured.values())) == 1, measured
    model = meta_model(scale, "uniform")
    formula = flops_per_token(model.cfg, model.num_params()) * T
    # 6N counts the norm weights too, which do no matmul: the only gap, far below 0.1 %.
    norm_params = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    assert measured["uniform"] == formula - 6 * norm_params * T
    assert abs(measured["uniform"] / formula - 1) < 1e-3


def test_same_seed_gives_identical_initial_weights():
    a = tiny_model(heads=(4, 4, 4, 4), seed=7)
    b = tiny_model(heads=(1, 2, 4, 4), seed=7)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    c = tiny_model(heads=(1, 2, 4, 4), seed=8)
    assert not torch.equal(sb["blocks.0.attn.qkv.weight"], c.state_dict()["blocks.0.attn.qkv.weight"])


def test_prism_schedule_at_h_base_equals_uniform_logits():
    torch.manual_seed(0)
    base = dict(n_layer=3, d_model=64, h_base=4, seq_len=32, vocab_size=300)
    uniform = PrismDecoder(ModelConfig(**base))
    torch.manual_seed(0)
    flat = PrismDecoder(ModelConfig(**base, heads=[4, 4, 4], schedule_name="prism"))
    idx = torch.randint(0, 300, (2, 32))
    assert torch.equal(uniform(idx), flat(idx))
    other = tiny_model(heads=(1, 2, 4), seq_len=32, vocab_size=300, seed=0)
    assert not torch.allclose(uniform(idx), other(idx))  # the split does change the function


def reference_attention(attn, x: torch.Tensor) -> torch.Tensor:
    """One head at a time, with loops and an explicit mask: the textbook definition."""
    B, T, C = x.shape
    q, k, v = (x @ attn.qkv.weight.T).split(C, dim=-1)
    dh = attn.head_dim
    half = dh // 2
    pos = torch.arange(T, dtype=torch.float64)
    outs = []
    for h in range(attn.n_head):
        sl = slice(h * dh, (h + 1) * dh)
        qh, kh, vh = q[..., sl].double(), k[..., sl].double(), v[..., sl].double()
        rot = []
        for t_ in (qh, kh):
            r = torch.empty_like(t_)
            for i in range(half):
                theta = pos / (attn_rope_base ** (2 * i / dh))
                a, b = t_[..., i], t_[..., i + half]
                r[..., i] = a * torch.cos(theta) - b * torch.sin(theta)
                r[..., i + half] = a * torch.sin(theta) + b * torch.cos(theta)
            rot.append(r)
        scores = rot[0] @ rot[1].transpose(-1, -2) / math.sqrt(dh)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        scores = scores.masked_fill(mask, float("-inf"))
        outs.append(scores.softmax(-1) @ vh)
    return (torch.cat(outs, dim=-1).float()) @ attn.proj.weight.T


attn_rope_base = 10000.0


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_attention_matches_plain_per_head_reference(layer):
    model = tiny_model(heads=(1, 2, 4, 4), seq_len=16).eval()
    attn = model.blocks[layer].attn
    x = torch.randn(2, 16, 64)
    expected = reference_attention(attn, x)
    assert torch.allclose(attn(x), expected, atol=1e-5, rtol=0)
    probs = []
    assert torch.allclose(attn(x, sink=lambda l, p: probs.append(p)), expected, atol=1e-5, rtol=0)
    assert probs[0].shape == (2, attn.n_head, 16, 16)
    assert torch.allclose(probs[0].sum(-1), torch.ones(2, attn.n_head, 16))
    assert probs[0].triu(1).abs().max() == 0  # causal


def test_explicit_attention_path_equals_fast_path():
    model = tiny_model(heads=(1, 2, 4, 4), seq_len=32).eval()
    idx = torch.randint(0, 512, (3, 32))
    fast = model(idx)
    logits, probs = model.attention_probs(idx)
    assert torch.allclose(fast, logits, atol=1e-5, rtol=0)
    assert [p.shape[1] for p in probs] == [1, 2, 4, 4]


def test_rope_is_relative():
    """Rotating q and k by positions m and n leaves q·k a function of m - n only."""
    from prism.core.model import rope_cache

    cos, sin = rope_cache(32, 8, 10000.0)
    q, k = torch.randn(8), torch.randn(8)

    def at(x, p):
        return apply_rope(x.expand(1, 1, 32, 8), cos, sin)[0, 0, p]

    # Relative to |q||k|: the angles p*theta (p <= 12) are rounded to float32, <= 4 eps each,
    # ~11 eps over the four; cos/sin, the rotation and the two 8-term dot products add < 50 eps
    # more. An absolute-position bug moves the product by O(|q||k|).
    tol = 64 * torch.finfo(torch.float32).eps * float(q.norm() * k.norm())
    assert torch.allclose(at(q, 5) @ at(k, 3), at(q, 12) @ at(k, 10), rtol=0, atol=tol)


def test_loss_ignores_padding_rows_and_targets_minus_one():
    model = tiny_model(vocab_size=500)  # padded to 512 rows
    assert model.cfg.padded_vocab == 512 and model.wte.weight.shape[0] == 512
    idx = torch.randint(0, 500, (2, 16))
    logits = model(idx)
    assert logits.shape == (2, 16, 500)
    targets = idx.clone()
    targets[:, :4] = -1
    expected = F.cross_entropy(logits[:, 4:].reshape(-1, 500), idx[:, 4:].reshape(-1))
    # The same per-token losses (~5 each) averaged by two different float32 reductions: the
    # mean of m positive terms is off by at most ~m roundings, i.e. rtol = m * eps. Counting
    # a padding row or an ignored target moves the loss by >1e-2.
    m = int((targets != -1).sum())
    assert torch.allclose(model(idx, targets), expected, rtol=m * torch.finfo(torch.float32).eps, atol=0)


def test_rmsnorm_bias_and_dropout_options_build_and_run():
    model = tiny_model(norm="rmsnorm", bias=True, dropout=0.1)
    model.train()
    loss = model(torch.randint(0, 512, (2, 16)), torch.randint(0, 512, (2, 16)))
    loss.backward()
    assert torch.isfinite(loss)
    with pytest.raises(ValueError, match="model.norm='batchnorm' is invalid"):
        tiny_model(norm="batchnorm")


@pytest.mark.slow
def test_compile_fullgraph_forward_backward_three_head_counts():
    torch._dynamo.reset()
    model = tiny_model(heads=(1, 2, 4, 4), seq_len=32)
    compiled = torch.compile(model, fullgraph=True)
    idx = torch.randint(0, 512, (2, 32))
    loss = compiled(idx, idx)
    loss.backward()
    eager = tiny_model(heads=(1, 2, 4, 4), seq_len=32)
    assert torch.allclose(loss, eager(idx, idx), atol=1e-4)
    assert all(p.grad is not None for p in model.parameters())


def test_chunked_output_loss_matches_the_plain_path():
    """ChunkedOutputLoss against logits + F.cross_entropy, float32 on the CPU: the same sums in
    another order (per-chunk matmuls, the weight gradient summed over chunks), so both agree to
    float32 rounding, ~1e-7 relative here; 1e-4 is the bound a fused/chunked path must meet.
    Ignored targets (-1), a chunk that does not divide the tokens, and a tied, padded output
    layer (vocab 300 padded to 320) are all in play."""
    torch.manual_seed(0)
    model = tiny_model(vocab_size=300)
    assert model.cfg.padded_vocab > model.cfg.vocab_size and model.lm_head.weight is model.wte.weight
    x = torch.randint(0, 300, (3, 20))
    y = torch.randint(0, 300, (3, 20))
    y[0, :5] = -1

    def loss_and_grads(chunk):
        model.zero_grad()
        model.loss_chunk = chunk
        loss = model(x, y)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    plain_loss, plain = loss_and_grads(0)
    chunked_loss, chunked = loss_and_grads(7)
    assert abs(chunked_loss - plain_loss) <= 1e-4 * abs(plain_loss)
    for name, g in plain.items():
        assert (chunked[name] - g).abs().max() <= 1e-4 * g.abs().max(), name
    model.loss_chunk = 7
    with torch.no_grad():  # evaluation takes the plain path: nothing to gain without gradients
        assert torch.equal(model(x, y), F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-1))
