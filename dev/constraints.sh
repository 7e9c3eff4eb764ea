#!/usr/bin/env bash
# Rewrite the two constraint files CI installs from (docs/install.md), from pyproject.toml:
#   constraints/ci.txt      the newest release of everything pyproject.toml admits (main CI job)
#   constraints/lowest.txt  every direct dependency at its declared floor (lower-bound CI job)
# Run it after changing a range, then run .ci/run: the files are only true once CI passed on them.
set -euo pipefail
cd "$(dirname "$0")/.."
uv=(python -m uv)
# --upgrade: uv would otherwise prefer the pins already in the output file
common=(pip compile --quiet --upgrade --extra dev --python-version 3.11 --python-platform x86_64-manylinux_2_28
        --no-header --no-annotate pyproject.toml)
"${uv[@]}" "${common[@]}" --resolution highest -o constraints/ci.txt
"${uv[@]}" "${common[@]}" --resolution lowest-direct -o constraints/lowest.txt
echo "wrote constraints/ci.txt and constraints/lowest.txt; now run .ci/run"
