"""The one exception the data pipeline raises for bad input: a sentence a person can act on."""


class DataError(ValueError):
    """Unusable data input; the message names the bad value and what would be valid."""


class StreamStalled(DataError):
    """A streaming source delivered nothing for data.stall_timeout_s; training turns this into a
    checkpoint at the last step boundary and a stop (see prism.callbacks.preemption). args[0] is
    what happened; str() adds what to do."""

    def __str__(self) -> str:
        return f"{self.args[0]}; check connectivity or raise data.stall_timeout_s."
