#!/usr/bin/env bash
# The lower-bound job: every direct dependency at the lowest release pyproject.toml admits
# (constraints/lowest.txt, uv's lowest-direct resolution), in a venv of its own, and the tests
# that cover training, resume, evaluation and the report. The floors are versions this job ran.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${PRISM_LOWEST_VENV:-${TMPDIR:-/tmp}/prism-lowest-venv}"
start=$SECONDS
rm -rf "$venv"
python -m uv venv --quiet --python "$(python -c 'import sys; print(sys.executable)')" "$venv"
# uv reads no pip configuration: torch 2.6.0 comes from the registry (a CUDA build, run on the CPU)
python -m uv pip install --quiet --python "$venv/bin/python" -c constraints/lowest.txt -e ".[dev]"
echo "lower-bound job: installed in $((SECONDS - start)) s:"
python -m uv pip list --python "$venv/bin/python" 2>/dev/null \
    | grep -iE '^(torch|lightning|torchmetrics|datasets|tensorboard|omegaconf|rich|tiktoken|numpy|pyarrow|safetensors|matplotlib|pydantic|jinja2|transformers|lm.eval|accelerate|optuna|wandb|mlflow-skinny|pytest) ' \
    | tr -s ' ' | paste -sd ',' | sed 's/,/, /g'
"$venv/bin/python" -m pytest -q -p no:cacheprovider \
    tests/test_supply_chain.py tests/test_compat.py tests/test_config.py tests/test_identity.py \
    tests/test_checkpoints.py tests/test_train.py tests/test_eval_engine.py tests/test_report.py \
    tests/test_stall.py
echo "lower-bound job: $((SECONDS - start)) s in all"
rm -rf "$venv"
