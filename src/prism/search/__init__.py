"""Search over head schedules of a scale (reproduce/search.py; docs/search.md).

space.py lists the candidate schedules, budget.py turns token rungs and a budget into trials and
costs, study.py keeps the Optuna study (journal file storage) and runs the worker loop, trial.py
trains one candidate as a normal kit run, final.py re-runs the best at the full budget through the
reproduction pipeline, ranking.py and stability.py hold the statistics, report.py writes
SEARCH.md and search.json (their names: prism.runs.layout).
"""
