"""The report stage: the paper's tables (`paper_tables/`) beside the reproduced numbers.

`write_report()` regenerates results/RESULTS.md and its plots from the JSON files the stages
write (docs/outputs.md); `load_paper_tables()` reads the paper's numbers.
"""

from prism.report.build import build_report, write_report
from prism.report.paper import PaperTables, load_paper_tables

__all__ = ["build_report", "write_report", "PaperTables", "load_paper_tables"]
