"""Where the stages run: the device layout of training and the launcher of every stage, the Slurm
allocation's where there is one; `--nodes` and `--gpus-per-node` describe one for a dry run, and an
explicit value that contradicts the allocation stops the plan (docs/cluster.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prism import cluster
from prism.config.schema import ConfigError
from prism.pipeline.stages import STAGES, Placement


@dataclass
class Layout:
    source: str  # what it was read from, for the plan
    overrides: list[str] = field(default_factory=list)
    launchers: dict[str, str] = field(default_factory=dict)


def resolve_layout(
    overrides: list[str],
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    alloc: cluster.Allocation | None = None,
) -> Layout | None:
    """The training layout and stage launchers for a plan, or None when neither an allocation nor
    --nodes/--gpus-per-node says anything (the config's train.devices/num_nodes then apply)."""
    for name, value in (("--nodes", nodes), ("--gpus-per-node", gpus_per_node)):
        if value is not None and value < 1:
            raise ConfigError(f"{name} {value} is invalid: give a positive count.")
    if nodes is None and gpus_per_node is None and alloc is None:
        return None
    if alloc is not None and nodes is None and gpus_per_node is None:
        n, g, source = alloc.nodes, alloc.procs_per_node, alloc.describe()
    else:
        n = nodes if nodes is not None else (alloc.nodes if alloc else 1)
        g = gpus_per_node if gpus_per_node is not None else (alloc.procs_per_node if alloc else 8)
        source = f"--nodes {n} --gpus-per-node {g}"
    layout = Layout(source)
    for key, want in (("train.devices", g), ("train.num_nodes", n)):
        given = next((o.split("=", 1)[1] for o in reversed(overrides) if o.split("=", 1)[0] == key), None)
        if given is None:
            layout.overrides.append(f"{key}={want}")
        elif given != str(want):
            raise ConfigError(
                f"{key}={given} contradicts the layout ({source}: {n} node(s) x {g} per node); "
                f"leave {key} unset and the kit uses the layout, or ask the scheduler for another."
            )
    if alloc is not None:
        layout.launchers = {
            stage.name: alloc.srun(*stage.placement.tasks(n, g))
            for stage in STAGES.parts()
            if stage.placement is not Placement.here
        }
    return layout
