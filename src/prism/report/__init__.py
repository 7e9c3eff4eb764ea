"""The report stage: results/RESULTS.md and its plots (`write_report()`), the paper's tables
(`paper_tables/`, `load_paper_tables()`) beside the reproduced numbers (docs/report.md)."""

from prism.report.build import build_report, write_report
from prism.report.paper import PaperTables, load_paper_tables

__all__ = ["build_report", "write_report", "PaperTables", "load_paper_tables"]
