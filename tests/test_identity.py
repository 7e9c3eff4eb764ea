"""A training run's identity is declared on the config fields (prism.runs.identity roles): every field
declares one, the identity is derived from the declarations, and the config hashes of every scale
are the ones runs already carry (a changed hash would make every existing run refuse to resume)."""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import get_type_hints

import pytest
from omegaconf import OmegaConf

from prism.config.roles import Role, execution_key, identity_key, role_tree
from prism.config.schema import RunConfig, load_config, to_dict
from prism.runs.identity import (
    LATER_KEYS,
    RUN_CONFIG_NAME,
    config_hash,
    saved_identity,
    stable_hash,
    training_identity,
)

# config_hash(load_config(scale, [schedule=..., data.source=...] + data.path=/x for local/shards)),
# as train_summary.json files of existing runs hold them.
PINNED_HASHES = {
    ("tiny", "uniform"): ("25172c7530e7d130", "ba81b1236bec7636", "b938b837a484e7d9", "390285064a746e9a"),
    ("tiny", "prism"): ("bac722874803f052", "26ca55a47c3a25fc", "0b45dfd3ce9e82b2", "cd053005c4d02873"),
    ("124m", "uniform"): ("987fb69ebe9e8b7f", "dec1d556751d6207", "0363d8f776d14844", "6292c06a0da0597b"),
    ("124m", "prism"): ("ed3b8c393e90a8c6", "f1c5bd8b76e93e62", "6897490a72a0650a", "ddd7da5ecab51934"),
    ("354m", "uniform"): ("e525629e7c006656", "696a2e90e7388c9a", "21e0beddeff806da", "4a57a40a1c461178"),
    ("354m", "prism"): ("7a528b6171d3bddf", "d9cbb78dbc42c3ef", "18e1a2305bf90d0c", "4938d61a9e2ba4c8"),
    ("757m", "uniform"): ("1c17fa508296c52b", "8af405c172cb1583", "051de549d196bcc7", "95157b788fc3ac7f"),
    ("757m", "prism"): ("f3a31faab54f6691", "ff0605f40f9c1d96", "fa615863d20aa20e", "917f5b927e2c79cb"),
}
SOURCES = ("hub", "local", "shards", "offline")


def _overrides(schedule: str, source: str) -> list[str]:
    path = [] if source in ("hub", "offline") else ["data.path=/x"]
    return [f"schedule={schedule}", f"data.source={source}", *path]


@pytest.mark.parametrize("scale,schedule", sorted(PINNED_HASHES))
def test_config_hashes_of_every_scale_are_pinned(scale, schedule):
    got = tuple(config_hash(load_config(scale, _overrides(schedule, s))) for s in SOURCES)
    assert dict(zip(SOURCES, got)) == dict(zip(SOURCES, PINNED_HASHES[(scale, schedule)]))


def _fields(schema: type, into: set[str], prefix: str = ""):
    """Every dotted key of the schema, into the nested dataclass sections named in `into`."""
    hints = get_type_hints(schema)
    for f in fields(schema):
        yield prefix + f.name
        if is_dataclass(hints[f.name]) and prefix + f.name in into:
            yield from _fields(hints[f.name], into, f"{prefix}{f.name}.")


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for name, (role, section) in tree.items():
        out[prefix + name] = role
        out.update(_flat(section or {}, f"{prefix}{name}."))
    return out


def test_every_config_field_declares_its_role():
    # role_tree is what training_identity reads: it refuses a field without a role, and it walks
    # into every identity section (the decoder's ModelConfig included, declared by the config)
    roles = _flat(role_tree(RunConfig))
    assert all(isinstance(role, Role) for role in roles.values())
    identity = {k for k, role in roles.items() if role is Role.identity}
    assert set(roles) == set(_fields(RunConfig, identity))
    assert roles["model.heads"] is Role.resolved and roles["model.d_model"] is Role.identity


def test_a_field_without_a_declaration_is_refused():
    @dataclass
    class Section:
        lr: float = identity_key(1e-3)
        workers: int = execution_key(4)
        new_knob: int = 3

    with pytest.raises(TypeError, match=r"Section\.new_knob declares no role"):
        role_tree(Section)


def test_the_declarations_say_which_keys_are_identity():
    roles = _flat(role_tree(RunConfig))
    execution = sorted(k for k, r in roles.items() if r is Role.execution)
    assert execution == sorted(
        [
            *(
                f"train.{k}"
                for k in (
                    "devices",
                    "num_nodes",
                    "strategy",
                    "accelerator",
                    "micro_batch",
                    "compile",
                    "fused",
                    "log_every_steps",
                    "ckpt_every_steps",
                    "keep_checkpoints",
                    "ddp_bucket_cap_mb",
                    "ddp_gradient_as_bucket_view",
                    "ddp_static_graph",
                    "ddp_timeout_s",
                    "loss_chunk_tokens",
                    "activation_checkpointing",
                    # what the memory plan assumes of the device and leaves free
                    "gpu_memory_gib",
                    "memory_overhead_gib",
                    "memory_fraction",
                    # how a hung or slow rank is found: watching a run never changes it
                    "hang_timeout_s",
                    "straggler_every_steps",
                    "straggler_slower_pct",
                    "straggler_intervals",
                    "preflight",
                    # trackers and in-loop zero-shot scores: watching a run never changes it
                    "loggers",
                    "wandb",
                    "mlflow",
                    "tracker_wait_s",
                    "eval_every_tokens",
                    "eval_tasks",
                    "eval_limit",
                    # a profiler trace watches the steps it names, like a tracker
                    "profile_steps",
                )
            ),
            *(
                f"data.{k}"
                for k in (
                    "num_workers",
                    "prefetch_factor",
                    "tokenizer_threads",
                    "hub_retries",
                    "hub_retry_interval_s",
                    "hub_open_attempts",
                    "stall_timeout_s",
                )
            ),
        ]
    )
    # the identity holds the schedule's heads, not the table or the model fields it fills in
    assert sorted(k for k, r in roles.items() if r is Role.resolved) == [
        "model.heads",
        "model.schedule_name",
        "schedules",
    ]
    other = {k for k, r in roles.items() if r is Role.other_stage}
    assert {"eval", "bench", "analysis", "run_all", "seeds", "run_schedules", "runs_dir"} <= other
    # the identity holds exactly the identity fields (plus the resolved heads), nothing else
    ident = training_identity(to_dict(load_config("124m")))
    assert set(ident) == {k for k, r in roles.items() if r is Role.identity and "." not in k} | {"heads"}
    # (less its sections' own keys, and the keys added later that are held at their earlier value)
    assert set(ident["train"]) == {
        k.split(".", 1)[1] for k, r in roles.items() if k.startswith("train.") and k.count(".") == 1
    } - {k.split(".", 1)[1] for k in [*execution, *LATER_KEYS] if k.startswith("train.")}


def test_identity_from_a_saved_config_yaml_matches_the_config(tmp_path):
    cfg = load_config("tiny", ["schedule=uniform", "train.micro_batch=2", "eval.limit=5"])
    OmegaConf.save(OmegaConf.create(to_dict(cfg)), tmp_path / RUN_CONFIG_NAME)
    assert stable_hash(saved_identity(tmp_path)) == config_hash(cfg)
    # a key the schema no longer knows stays in the identity: an old run is seen as different
    saved = to_dict(cfg)
    saved["train"]["retired_knob"] = 1
    assert stable_hash(training_identity(saved)) != config_hash(cfg)
