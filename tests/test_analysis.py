"""Attention distance (paper Eq. 1) on cases with a closed form, driven through the real
reduction code and through a real model whose attention is forced, and ΔD_l on shared sequences.

Convention: positions t, s are 1-based as in the paper; Q = {floor(T/2)+1..T}; tensor rows are
t-1. Uniform causal attention gives (t-1)/2 per query; self-attention 0; a fixed offset k gives k.
"""

import json
import math

import pytest
import torch
from conftest import load_script

from prism.core.model import ModelConfig, PrismDecoder
from prism.measure.analysis import DistanceAccumulator, attention_distance, distance_matrix, query_positions
from prism.measure.analysis.compare import AnalysisError, analyze, deltas, fingerprint
from prism.runs.checkpoint import export_safetensors, load_model

main = load_script("analyze").main  # reproduce/analyze.py's


def uniform_closed_form(T: int) -> float:
    """Mean over t in Q (1-based) of (t - 1) / 2."""
    ts = range(T // 2 + 1, T + 1)
    return sum((t - 1) / 2 for t in ts) / len(ts)


def causal_uniform_probs(B, h, T):
    mask = torch.ones(T, T).tril()
    return (mask / mask.sum(-1, keepdim=True)).expand(B, h, T, T).clone()


def offset_probs(B, h, T, k):
    p = torch.zeros(B, h, T, T)
    for i in range(T):
        p[:, :, i, max(i - k, 0)] = 1.0  # rows before k (outside Q for k <= T/2) clamp to s=1
    return p


@pytest.mark.parametrize("T", [16, 15, 1024])
def test_query_set_is_second_half_of_the_window(T):
    rows = query_positions(T)
    assert rows[0] + 1 == T // 2 + 1 and rows[-1] + 1 == T  # 1-based t = floor(T/2)+1 .. T
    d = distance_matrix(T)
    assert d.shape == (T - T // 2, T)
    assert d[0, 0] == T // 2 and d[-1, -1] == 0


@pytest.mark.parametrize("T", [16, 15, 64])
def test_closed_forms_through_the_reduction(T):
    acc = DistanceAccumulator()
    acc(0, causal_uniform_probs(2, 3, T))
    acc(1, torch.eye(T).expand(2, 3, T, T))
    acc(2, offset_probs(2, 3, T, 5))
    D = acc.per_layer()
    assert D[0] == pytest.approx(uniform_closed_form(T), rel=1e-6)
    assert D[1] == 0.0
    assert D[2] == pytest.approx(5.0, rel=1e-6)
    if T == 16:  # spelled out: t = 9..16 gives (t-1)/2 = 4, 4.5, ..., 7.5, mean 5.75
        assert D[0] == pytest.approx(5.75)


def test_heads_are_averaged_and_batches_accumulate():
    T = 32
    probs = torch.cat(
        [torch.eye(T).expand(1, 1, T, T), offset_probs(1, 1, T, 3), causal_uniform_probs(1, 1, T)], dim=1
    )  # 3 heads
    whole, split = DistanceAccumulator(), DistanceAccumulator()
    whole(0, torch.cat([probs, probs]))
    split(0, probs)
    split(0, probs)
    assert whole.per_head()[0] == pytest.approx([0.0, 3.0, uniform_closed_form(T)])
    assert whole.per_layer()[0] == pytest.approx((3.0 + uniform_closed_form(T)) / 3)
    assert split.per_head()[0] == pytest.approx(whole.per_head()[0])
    # only queries in Q count: changing the rows of the first half changes nothing
    early = probs.clone()
    early[:, :, : T // 2] = causal_uniform_probs(1, 3, T)[:, :, : T // 2]
    other = DistanceAccumulator()
    other(0, early)
    assert other.per_head()[0] == pytest.approx(whole.per_head()[0])


# ----- a real model whose attention is forced ------------------------------------------------
def tiny_cfg(heads=(2, 4), **kw):
    return ModelConfig(
        n_layer=2,
        d_model=32,
        h_base=4,
        heads=list(heads),
        vocab_size=64,
        vocab_multiple=8,
        seq_len=32,
        bias=True,
        **kw,
    )


def force_attention(model: PrismDecoder, offset: int | None, strength: float = 400.0) -> None:
    """Make every query the same vector q and every key the same k (zero Q/K weights, biases
    set), so the score of query t on key s depends only on s - t through RoPE. With q equal to k
    rotated back by `offset` positions, the score peaks at s = t - offset; `strength` makes the
    softmax one-hot. offset=None zeroes Q and K: every score is 0, attention is uniform."""
    with torch.no_grad():
        for block in model.blocks:
            attn = block.attn
            d, dh, h = model.cfg.d_model, attn.head_dim, attn.n_head
            attn.qkv.weight[: 2 * d].zero_()
            attn.qkv.bias[: 2 * d].zero_()
            if offset is None:
                continue
            k = torch.ones(dh) * math.sqrt(strength / dh) * dh**0.25
            # q = R(-offset) k, RoPE's rotation (x1 cos - x2 sin, x1 sin + x2 cos) at -offset
            cos, sin = attn.rope_cos[offset], attn.rope_sin[offset]
            k1, k2 = k[: dh // 2], k[dh // 2 :]
            q = torch.cat([k1 * cos + k2 * sin, -k1 * sin + k2 * cos])
            attn.qkv.bias[:d] = q.repeat(h)
            attn.qkv.bias[d : 2 * d] = k.repeat(h)


@pytest.mark.parametrize("offset", [None, 0, 1, 4])
def test_forced_model_attention_matches_closed_form(offset):
    torch.manual_seed(0)
    model = PrismDecoder(tiny_cfg())
    force_attention(model, offset)
    windows = torch.randint(0, 64, (3, 33))
    out = attention_distance(model, windows, batch_size=2)
    expected = uniform_closed_form(32) if offset is None else float(offset)
    assert out["D"] == pytest.approx([expected, expected], abs=1e-3)
    assert [len(h) for h in out["D_per_head"]] == [2, 4]
    # the forced probabilities really are what the model computes
    _, probs = model.attention_probs(windows[:1, :32])
    if offset is not None:
        assert probs[0][0, 0, 20, 20 - offset].item() == pytest.approx(1.0, abs=1e-4)


def test_bad_windows_are_refused():
    model = PrismDecoder(tiny_cfg())
    with pytest.raises(ValueError, match="do not fit"):
        attention_distance(model, torch.zeros(2, 10, dtype=torch.long))


# ----- ΔD_l over checkpoints -----------------------------------------------------------------
def export(tmp_path, name, heads, seed, offset=None):
    torch.manual_seed(seed)
    cfg = tiny_cfg(heads, schedule_name=name)
    model = PrismDecoder(cfg)
    if offset is not None:  # make the two checkpoints' attention clearly different
        force_attention(model, offset)
    out = tmp_path / f"{name}-{seed}"
    export_safetensors(model, out, {"seed": seed, "scale": "tiny", "schedule": name})
    return str(out / "model.safetensors"), model


def test_delta_uses_the_same_sequences_for_both_checkpoints(tmp_path):
    uni_path, uni = export(tmp_path, "uniform", (4, 4), 0)
    pri_path, pri = export(tmp_path, "prism", (2, 4), 0, offset=2)
    windows = torch.randint(0, 64, (5, 33), generator=torch.Generator().manual_seed(7))
    res = analyze([uni_path, pri_path], windows, batch_size=2)
    sha = fingerprint(windows)
    assert [e["sequences_sha256"] for e in res["checkpoints"]] == [sha, sha]
    # each D is exactly what the model gives on these windows (and not on others): float32 D
    # moves ~1e-8 with the batch shape, so it is measured as analyze() does (the weights it
    # loads, the same batches) and must be bit-equal
    d_uni = attention_distance(load_model(uni_path)[0], windows, batch_size=2)["D"]
    d_pri = attention_distance(load_model(pri_path)[0], windows, batch_size=2)["D"]
    assert res["checkpoints"][0]["D"] == d_uni
    assert res["checkpoints"][1]["D"] == d_pri
    other = attention_distance(uni, torch.randint(0, 64, (5, 33)))["D"]
    assert other != pytest.approx(d_uni, rel=1e-6)
    assert d_pri == pytest.approx([2.0, 2.0], abs=1e-3)
    assert res["delta"]["prism"]["mean"] == [a - b for a, b in zip(d_pri, d_uni)]  # one seed: a - b
    assert res["delta"]["prism"]["std"] is None and res["delta"]["prism"]["seeds"] == [0]
    # entries measured on different sequences are never differenced
    bad = [dict(res["checkpoints"][0]), dict(res["checkpoints"][1], sequences_sha256="x")]
    with pytest.raises(AnalysisError, match="different sequences"):
        deltas(bad)


def test_delta_mean_and_sd_over_seeds():
    def entry(schedule, seed, D):
        return {
            "schedule": schedule,
            "seed": seed,
            "D": D,
            "path": f"{schedule}{seed}",
            "sequences_sha256": "s",
        }

    res = deltas(
        [
            entry("uniform", 0, [10.0, 5.0]),
            entry("uniform", 1, [12.0, 5.0]),
            entry("prism", 1, [9.0, 6.0]),
            entry("prism", 0, [4.0, 8.0]),
        ]
    )["prism"]
    per_seed = [[-6.0, 3.0], [-3.0, 1.0]]
    assert res["mean"] == pytest.approx([-4.5, 2.0])
    assert res["std"] == pytest.approx([math.sqrt(4.5), math.sqrt(2.0)])  # sample s.d. (n-1)
    assert sorted(res["seeds"]) == [0, 1] and sorted(res["per_seed"].values()) == per_seed
    with pytest.raises(AnalysisError, match="two checkpoints of schedule 'prism' and seed 0"):
        deltas([entry("uniform", 0, [1.0]), entry("prism", 0, [2.0]), entry("prism", 0, [3.0])])


def test_cli_writes_analysis_json(tmp_path, capsys):
    uni_path, _ = export(tmp_path, "uniform", (4, 4), 0)
    pri_path, _ = export(tmp_path, "prism", (2, 4), 0)
    windows_file = tmp_path / "w.pt"
    torch.save(torch.randint(0, 64, (6, 33)), windows_file)
    out = tmp_path / "analysis.json"
    rc = main(
        [
            "--checkpoints",
            uni_path,
            pri_path,
            "--windows",
            str(windows_file),
            "--sequences",
            "4",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["sequences"] == 4 and res["seq_len"] == 32 and res["scale"] == "tiny"
    assert res["query_positions_1based"] == [17, 32]
    assert [e["schedule"] for e in res["checkpoints"]] == ["uniform", "prism"]
    assert len(res["delta"]["prism"]["mean"]) == 2
    # a rerun reuses finished checkpoints (resume); a changed checkpoint is measured again
    before = {e["path"]: e["D"] for e in res["checkpoints"]}
    export(tmp_path, "prism", (2, 4), 0, offset=1)  # rewrite the prism weights
    assert (
        main(
            [
                "--checkpoints",
                uni_path,
                pri_path,
                "--windows",
                str(windows_file),
                "--sequences",
                "4",
                "--device",
                "cpu",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    again = json.loads(out.read_text())
    assert again["checkpoints"][0]["D"] == before[uni_path]
    assert again["checkpoints"][1]["D"] == pytest.approx([1.0, 1.0], abs=1e-3)
    assert not (tmp_path / "analysis.json.partial").exists()
    # a missing checkpoint is one clear sentence and exit code 2, nothing written
    rc = main(
        [
            "--checkpoints",
            str(tmp_path / "nope.safetensors"),
            "--windows",
            str(windows_file),
            "--out",
            str(tmp_path / "x.json"),
        ]
    )
    assert rc == 2 and "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_cli_draws_heldout_validation_windows_from_the_run_config(tmp_path):
    """Without --windows the sequences are prism.data.heldout_windows of the run config stored in
    a training checkpoint (here the tiny scale's offline validation text); every checkpoint,
    whatever its format, sees the same ones."""
    from prism.config.schema import load_config, to_dict
    from prism.data import heldout_windows

    run = load_config("tiny")
    torch.manual_seed(0)
    uniform = PrismDecoder(run.model_config("uniform"))
    ckpt = tmp_path / "uniform.ckpt"  # the layout PrismLM's Lightning checkpoints have
    torch.save(
        {
            "state_dict": {f"model.{k}": v for k, v in uniform.state_dict().items()},
            "global_step": 3,
            "hyper_parameters": {
                "model": uniform.cfg.to_dict(),
                "run": to_dict(run),
                "scale": "tiny",
                "schedule": "uniform",
                "seed": 0,
            },
        },
        ckpt,
    )
    torch.manual_seed(0)
    prism = PrismDecoder(run.model_config("prism"))
    export_safetensors(prism, tmp_path / "prism", {"scale": "tiny", "schedule": "prism", "seed": 0})
    out = tmp_path / "analysis.json"
    assert (
        main(
            [
                "--checkpoints",
                str(ckpt),
                str(tmp_path / "prism"),
                "--sequences",
                "2",
                "--device",
                "cpu",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())
    expected = fingerprint(heldout_windows(run, 2))
    assert res["sequences_sha256"] == expected
    assert {e["sequences_sha256"] for e in res["checkpoints"]} == {expected}
    assert res["seq_len"] == 256 and len(res["checkpoints"][1]["D"]) == 8
    assert [e["schedule"] for e in res["checkpoints"]] == ["uniform", "prism"]
    assert res["delta"]["prism"]["seeds"] == [0]
