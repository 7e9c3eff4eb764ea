"""data.source=local: local parquet/jsonl/txt files, streamed exactly as the hub stream is."""

from __future__ import annotations

import logging
from pathlib import Path

from prism.data.errors import DataError
from prism.data.source import DocumentSource
from prism.data.sources.bad_files import LOOKUP_BUDGET_S, check_data_file, file_error
from prism.data.text import MissingText, text_column

# file suffix -> datasets builder; .txt files are one document per file
_BUILDERS = {
    ".parquet": "parquet",
    ".txt": "text",
    **dict.fromkeys((".jsonl", ".json", ".jsonl.gz", ".json.gz"), "json"),
}


def _suffix(path: Path) -> str:
    name = path.name.lower()
    return next(
        (s for s in sorted(_BUILDERS, key=len, reverse=True) if name.endswith(s)), path.suffix.lower()
    )


def local_data_files(path_spec: str) -> tuple[str, list[str]]:
    """Resolve data.path (a file, a folder searched recursively, or a comma-separated list of
    them) into one datasets builder name and a sorted list of files."""
    files: list[Path] = []
    for part in [p.strip() for p in str(path_spec).split(",") if p.strip()]:
        p = Path(part).expanduser()
        if not p.exists():
            raise DataError(
                f"data.path entry {part!r} does not exist; give a .parquet/.jsonl/.txt file "
                "or a folder of them."
            )
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and _suffix(f) in _BUILDERS)
            if not found:
                raise DataError(f"data.path folder {part!r} holds no .parquet, .jsonl, .json or .txt files.")
            files.extend(found)
        else:
            if _suffix(p) not in _BUILDERS:
                raise DataError(
                    f"data.path file {part!r} has an unsupported type; use .parquet, .jsonl, "
                    ".json(.gz) or .txt."
                )
            files.append(p)
    if not files:
        raise DataError(f"data.path={path_spec!r} names no files.")
    builders = {_BUILDERS[_suffix(f)] for f in files}
    if len(builders) > 1:
        raise DataError(
            f"data.path={path_spec!r} mixes file types ({', '.join(sorted(builders))}); "
            "point it at files of one type."
        )
    return builders.pop(), [str(f) for f in files]


# datasets logs "Failed to ..." before it re-raises; the DataError built from that exception names
# the file, and a bad file gets one sentence
for _name in ("datasets.packaged_modules.json.json", "datasets.packaged_modules.parquet.parquet"):
    logging.getLogger(_name).addFilter(lambda record: not str(record.msg).startswith("Failed to "))


class LocalSource(DocumentSource):
    """The file(s) or folder data.path, read with `datasets` streaming: a local copy of FineWeb
    behaves exactly like the hub stream."""

    needs = {"path": "the folder or file(s) to read"}
    identity_keys = ("path",)

    def describe(self) -> str:
        return f"local text files {self.data.path}"

    def identity(self) -> dict:
        """The names of the files, not their paths: the same data on another machine."""
        return {"source": self.name, "files": [Path(f).name for f in local_data_files(self.data.path)[1]]}

    def open_documents(self):
        if not self.data.path:
            raise DataError("data.source=local needs data.path, the file(s) or folder to read.")
        builder, files = local_data_files(self.data.path)
        self._files = files  # what read_error looks among, even if one is removed meanwhile
        for f in files:  # the cheap checks (empty, not gzip, parquet footer, first record) first
            check_data_file(Path(f), self.data.path)
        try:  # datasets reads the first file's schema here
            ds = _stream(builder, files)
        except Exception as exc:
            raise self.read_error(exc, self.where()) from None
        return text_column(ds, self.data.path, lambda exc: self.read_error(exc, self.where()))

    def read_error(self, exc: BaseException, who: str) -> DataError:
        """A DataError naming the data file that `exc` came from and what is wrong with it
        (bad_files.file_error)."""
        files = getattr(self, "_files", None) or local_data_files(self.data.path)[1]
        # the files may be read again for LOOKUP_BUDGET_S, or a quarter of a lower stall timeout
        budget = min(LOOKUP_BUDGET_S, float(self.data.stall_timeout_s) / 4)
        return file_error(exc, files, self.data.path, self.read_file, who, budget)

    def read_file(self, f: str):
        """Read data file `f` in full as the stream reads it, one arrow batch at a time (the
        documents are never turned into Python strings); MissingText at a record without text."""
        for table in _stream(_BUILDERS[_suffix(Path(f))], [f]).with_format("arrow").iter(batch_size=1024):
            if "text" not in table.column_names or table.column("text").null_count:
                raise MissingText(f)
            yield


def _stream(builder: str, files: list[str]):
    """`files` as one streaming datasets.IterableDataset, read by `builder`."""
    import datasets

    kwargs = {"sample_by": "document"} if builder == "text" else {}
    return datasets.load_dataset(
        builder, data_files={"train": files}, split="train", streaming=True, **kwargs
    )
