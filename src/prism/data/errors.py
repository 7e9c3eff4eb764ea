"""The one exception the data pipeline raises for bad input: a sentence a person can act on."""

from __future__ import annotations

from prism.errors import PrismError


class DataError(PrismError, ValueError):
    """Unusable data input; the message names the bad value and what would be valid."""


class StreamStalled(DataError):
    """A streaming source delivered nothing for data.stall_timeout_s (training checkpoints and
    stops); args[0] is what happened, str() adds what to do."""

    def __str__(self) -> str:
        return f"{self.args[0]}; check connectivity or raise data.stall_timeout_s."


WORKER_PREFIX = "Caught "  # torch.utils.data's re-raised worker exception starts so


def from_worker(exc: DataError) -> DataError:
    """The DataError a DataLoader worker raised, as its own sentence, from the traceback text torch
    re-raises it with (last line "<module>.<Type>: <the sentence>"); any other is returned as it is."""
    text = str(exc.args[0]) if exc.args else ""
    if not (text.startswith(WORKER_PREFIX) and "\nOriginal Traceback" in text):
        return exc
    last = text.rstrip().splitlines()[-1]
    name, sep, sentence = last.partition(": ")
    if not sep or name.rsplit(".", 1)[-1] != type(exc).__name__:
        return exc
    # a type whose str() adds words of its own (StreamStalled) gets back only its message
    before, _, after = str(type(exc)("\0")).partition("\0")
    return type(exc)(sentence.removeprefix(before).removesuffix(after))
