"""The report's prose: jinja2 templates in report/templates/, one per paragraph, written as
they appear in RESULTS.md; a section fills in only the values a sentence names."""

from __future__ import annotations

from functools import cache

from jinja2 import Environment, PackageLoader, StrictUndefined


@cache
def _environment() -> Environment:
    # markdown, not HTML: nothing is escaped; a value a template names but is not given is an error
    return Environment(loader=PackageLoader("prism.report", "templates"), undefined=StrictUndefined)


def prose(name: str, **values) -> str:
    """templates/<name>.md filled in with `values`, without its final line break."""
    return _environment().get_template(f"{name}.md").render(**values).rstrip("\n")
