"""The registry of data sources: the names data.source accepts, each a `DataSource` class
(docs/data.md, "Adding a source"). Everything else asks `source_for(cfg.data)`, never the name."""

from __future__ import annotations

from prism.data.errors import DataError
from prism.data.source import DataSource
from prism.data.sources.hub import HubSource
from prism.data.sources.local import LocalSource
from prism.data.sources.offline import OfflineSource
from prism.data.sources.shards import ShardSource
from prism.errors import ConfigError
from prism.registry import Registry

SOURCES: Registry[type[DataSource]] = Registry("data source", key="data.source")
SOURCES.add("hub", HubSource)  # HuggingFaceFW/fineweb streamed from the hub
SOURCES.add("local", LocalSource)  # the same streaming path over local files
SOURCES.add("shards", ShardSource)  # prepare_fineweb.py's uint16 token shards, memory-mapped
SOURCES.add("offline", OfflineSource)  # Python's own documentation text: no network, no files

_BUILT_IN = frozenset(SOURCES)

# data.* keys that a run's identity holds only when its source names them among its
# identity_keys (every other data.* key is in every identity, as it always was: config hashes
# of existing runs stay valid)
SOURCE_ONLY_IDENTITY_KEYS = ("revision",)


def register_source(name: str, cls: type[DataSource], replace: bool = False) -> None:
    """Make data.source=`name` read with `cls`. replace=True swaps out a registered source (a
    wrapped one, say); otherwise a name already taken is refused."""
    if not (isinstance(cls, type) and issubclass(cls, DataSource)):
        raise TypeError(
            f"register_source({name!r}, {cls!r}): the class must subclass prism.data.source.DataSource."
        )
    SOURCES.add(name, cls, replace=replace)


def unregister_source(name: str) -> None:
    """Forget a source registered with `register_source` (a built-in one stays)."""
    if name in _BUILT_IN:
        raise ValueError(
            f"data source {name!r} is built in; register_source(..., replace=True) swaps it out."
        )
    SOURCES.remove(name)


def source_for(data) -> DataSource:
    """The source that reads data section `data` (RunConfig.data)."""
    return SOURCES.get(str(data.source))(data)


def check_data_section(data) -> None:
    """Refuse, in one sentence, a data section that names no usable source (an unknown data.source,
    or a key it needs left unset): the config layer checks only the keys' types and ranges."""
    name = str(data.source)
    if name not in SOURCES:
        raise ConfigError(SOURCES.unknown(name))
    for key, what in SOURCES.get(name).needs.items():
        if not getattr(data, key):
            raise ConfigError(f"data.source={name} needs data.{key}, {what}.")


def identity_keys_not_read(data: dict) -> list[str]:
    """The data.* keys of a resolved config (a plain dict) that its source does not read, left out of
    a run's identity; a source not registered here (a run recorded elsewhere) reads none of them."""
    name = str(data.get("source"))
    declared = SOURCES.get(name).identity_keys if name in SOURCES else ()
    return [k for k in SOURCE_ONLY_IDENTITY_KEYS if k not in declared]


def check_source_reachable(data) -> None:
    """Raise DataError now if data section `data`'s source can only fail later (data.source=hub
    with the hub switched off), before a job is queued or GPUs are held."""
    why = source_for(data).unreachable()
    if why:
        raise DataError(why)


def training_data_identity(data) -> dict:
    """What a run read, independent of the machine (train_summary.json's `data`)."""
    return source_for(data).identity()
