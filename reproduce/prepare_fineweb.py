#!/usr/bin/env python
"""Tokenize FineWeb (hub or local files) into uint16 .bin shards for data.source=shards.

  python reproduce/prepare_fineweb.py --scale 124m --source hub --out data/fineweb10B
  python reproduce/prepare_fineweb.py --scale tiny --source local --path /data/fineweb/ --out data/fw

The command is prism.cli.prepare_fineweb; `--help` shows every option.
"""

import sys

from prism.cli.prepare_fineweb import main

if __name__ == "__main__":
    sys.exit(main())
