"""The one exception the data pipeline raises for bad input: a sentence a person can act on."""


class DataError(ValueError):
    """Unusable data input; the message names the bad value and what would be valid."""
