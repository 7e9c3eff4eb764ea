"""prism.compat against the installed Lightning and torch: every internal it relies on is there and
behaves as the kit assumes, and a missing one stops with one sentence naming the version.

The step-boundary helper is compared with Lightning's own private answer on a real fit: that is
the one place a test reads `_should_accumulate`, so a change of Lightning's rule shows here."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.nn.attention import SDPBackend
from torch.utils.data import DataLoader, TensorDataset

from prism import compat


class _Linear(L.LightningModule):
    """The smallest module with real optimizer steps; records the boundary answers per batch."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.answers: list[tuple[bool, bool]] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        trainer = self.trainer
        self.answers.append(
            (compat.is_step_boundary(trainer), not trainer.fit_loop.epoch_loop._should_accumulate())
        )
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(tmp_path, **kwargs) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        **kwargs,
    )


def _data(batches: int) -> DataLoader:
    gen = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(torch.randn(batches, 4, generator=gen), torch.randn(batches, 1, generator=gen))
    )


def test_step_boundary_agrees_with_lightning_on_every_micro_batch(tmp_path):
    # 10 batches an epoch with accumulation 3: steps end at batches 3, 6, 9 and at the epoch's
    # last batch (10), where Lightning steps on an incomplete accumulation
    module = _Linear()
    trainer = _trainer(tmp_path, max_steps=9, accumulate_grad_batches=3, enable_checkpointing=False)
    trainer.fit(module, _data(10))
    ours = [a for a, _ in module.answers]
    assert ours == [b for _, b in module.answers]
    assert ours[:10] == [False, False, True, False, False, True, False, False, True, True]
    assert sum(ours) == trainer.global_step == 9


def test_the_trainer_check_passes_and_the_sigterm_broadcast_is_silenced(tmp_path):
    trainer = _trainer(tmp_path, max_steps=1)
    compat.check_trainer(trainer)
    compat.silence_sigterm_broadcast(trainer)
    # the instance's method is now a no-op: no collective, no SIGTERMException
    assert trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor() is None


def test_a_missing_internal_stops_with_one_sentence_naming_the_version(tmp_path, monkeypatch):
    trainer = _trainer(tmp_path, max_steps=1)
    monkeypatch.delattr(type(trainer.fit_loop.epoch_loop), compat.SIGTERM_BROADCAST)
    for call in (compat.check_trainer, compat.silence_sigterm_broadcast):
        with pytest.raises(compat.CompatError) as err:
            call(trainer)
        message = str(err.value)
        assert f"Lightning {L.__version__} has no " in message and compat.SIGTERM_BROADCAST in message
        assert message.count(". ") == 0 and message.endswith("pyproject.toml gives.")


def test_checkpoint_progress_counters_are_where_the_kit_reads_them(tmp_path):
    module = _Linear()
    trainer = _trainer(tmp_path, max_steps=4, accumulate_grad_batches=2, enable_checkpointing=False)
    trainer.fit(module, _data(20))
    path = tmp_path / "c.ckpt"
    trainer.save_checkpoint(path)
    fit_loop = torch.load(path, weights_only=True)["loops"]["fit_loop"]
    assert compat.processed_micro_batches(fit_loop) == 4 * 2
    before = {part: dict(compat.batch_progress(fit_loop)[part]) for part in compat.PROGRESS_PARTS}
    compat.shift_batch_progress(fit_loop, 4)
    for part in compat.PROGRESS_PARTS:
        for count in compat.PROGRESS_COUNTS:
            assert compat.batch_progress(fit_loop)[part][count] == before[part][count] + 4
    boundary = compat.batch_progress(compat.step_boundary_state(trainer))
    assert all(boundary[p]["ready"] == boundary[p]["started"] for p in compat.PROGRESS_PARTS)
    with pytest.raises(compat.CompatError, match="epoch_loop.batch_progress"):
        compat.batch_progress({"epoch_loop.state_dict": {}})


@pytest.mark.slow
def test_torch_internals_used_by_the_benchmark():
    q = torch.randn(1, 2, 8, 16)
    assert compat.sdpa_choice(q, q, q) in {int(b) for b in SDPBackend.__members__.values()}
    compat.raise_recompile_limit(64)
    import torch._dynamo.config as dynamo_config

    # torch 2.6 names the knob cache_size_limit; 2.7 renamed it recompile_limit
    knobs = [k for k in ("recompile_limit", "cache_size_limit") if hasattr(dynamo_config, k)]
    assert knobs and all(getattr(dynamo_config, k) >= 64 for k in knobs)
    layer = torch.nn.Linear(2, 2)
    layer.compile()
    assert layer._compiled_call_impl is not None
    compat.uncompile(layer)
    assert layer._compiled_call_impl is None
    assert layer(torch.ones(1, 2)).shape == (1, 2)


def test_the_cuda_memory_history_takes_the_calls_the_kit_makes(tmp_path, monkeypatch):
    import inspect

    import torch.cuda.memory as cuda_memory

    compat.check_memory_history()
    # the arguments prism.compat passes bind to torch's signatures (a renamed keyword fails here,
    # not at the end of a profiled GPU run); where there is a GPU, a real round trip
    record = inspect.signature(cuda_memory._record_memory_history)
    record.bind(max_entries=10)
    record.bind(enabled=None)
    inspect.signature(cuda_memory._dump_snapshot).bind("snapshot.pickle")
    if torch.cuda.is_available():
        compat.record_memory_history(10)
        torch.ones(1024, device="cuda")
        compat.dump_memory_snapshot(str(tmp_path / "s.pickle"))
        compat.stop_memory_history()
        assert (tmp_path / "s.pickle").stat().st_size > 0
    monkeypatch.delattr(cuda_memory, "_dump_snapshot")
    with pytest.raises(compat.CompatError) as err:
        compat.check_memory_history()
    message = str(err.value)
    assert message.startswith(f"torch {torch.__version__} has no torch.cuda.memory._dump_snapshot, ")
    assert message.count(". ") == 0 and message.endswith("pyproject.toml gives.")


def test_the_compile_wrapper_is_the_one_torch_compile_puts_in_state_dict_keys():
    wrapped = torch.compile(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    keys = list(wrapped.state_dict())
    assert all(compat.COMPILE_WRAPPER in k for k in keys)
    assert [compat.without_compile_wrapper(k) for k in keys] == ["0.weight", "0.bias"]


def test_the_rung_key_is_the_one_optunas_successive_halving_files():
    import optuna

    pruner = optuna.pruners.SuccessiveHalvingPruner(
        min_resource=1, reduction_factor=2, min_early_stopping_rate=0
    )
    study = optuna.create_study(pruner=pruner)
    trial = study.ask()
    trial.report(1.0, step=1)
    trial.should_prune()
    keys = list(study.trials[0].system_attrs)
    assert keys and all(compat.is_rung_key(k) for k in keys), keys
    assert not compat.is_rung_key("fixed_params") and not compat.is_rung_key("completed_rung_")


def test_the_accelerator_registry_lists_the_trainers_accelerators():
    assert {"cpu", "cuda"} <= set(compat.registered_accelerators())


def test_train_strategy_is_checked_against_lightnings_registry():
    # prism.config.values keeps no copy of the names: every one Lightning registers is accepted,
    # and a refusal lists them from the registry itself
    from prism.config.schema import ConfigError, load_config

    registered = compat.registered_strategies()
    assert {"ddp", "ddp_spawn", "fsdp", "single_device"} <= set(registered), registered
    for name in registered:
        assert load_config("tiny", [f"train.strategy={name}"]).train.strategy == name
    with pytest.raises(ConfigError) as err:
        load_config("tiny", ["train.strategy=ddp_nosuch"])
    named = str(err.value).split("strategy names: ")[1]
    listed = [n for n in registered if "_find_unused_parameters_" not in n and n not in ("ddp", "fsdp")]
    assert listed and all(n in named for n in listed), named


def test_fake_tensors_and_dispatch_modes_work_as_the_memory_plan_uses_them():
    """prism.train.memory runs the decoder in fake tensors and sees every op's outputs."""
    seen: list[str] = []

    class Ops(compat.dispatch_mode()):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with compat.fake_tensor_mode():
        big = torch.empty(1 << 30, dtype=torch.float32)  # 4 GiB, none of it allocated
        with Ops():
            product = big[:4] * 2
    assert big.untyped_storage().nbytes() == 4 << 30
    assert product.shape == (4,) and type(product).__name__ == "FakeTensor"
    assert "aten.mul.Tensor" in seen


def test_the_collective_timeout_and_the_flight_recorder_take_the_calls_the_watchdog_makes(tmp_path):
    """On a one-rank gloo group: the timeout is changed for the next collective, and the flight
    recorder's record (where this torch keeps one) is bytes."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=600))
    try:
        compat.set_collective_timeout(timedelta(seconds=42))
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        assert backend.options._timeout == timedelta(seconds=42)
        dist.all_reduce(torch.ones(1))
        dump = compat.flight_recorder_dump()
        assert dump is None or isinstance(dump, bytes)
    finally:
        dist.destroy_process_group()


def test_partitioned_graphs_gives_the_forward_and_backward_the_memory_plan_walks():
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return (self.lin(x).relu().sum(),)

    with compat.fake_tensor_mode():
        net = Net()
        forward, backward = compat.partitioned_graphs(net, (torch.randn(2, 4),))
    assert any(n.op == "output" for n in forward.graph.nodes)
    assert backward is not None and any(n.op == "placeholder" for n in backward.graph.nodes)


def test_op_names_and_the_dtype_copy_are_read_from_real_ops():
    import torch

    from prism.compat import is_dtype_copy, op_name

    assert op_name(torch.ops.aten.mm.default) == "mm" and op_name(torch.ops.aten.scatter.src) == "scatter"
    assert is_dtype_copy(torch.ops.aten._to_copy.default) and not is_dtype_copy(torch.ops.aten.mm.default)
