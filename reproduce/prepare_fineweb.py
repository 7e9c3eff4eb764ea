#!/usr/bin/env python
"""Tokenize FineWeb (hub or local files) into uint16 .bin shards for data.source=shards.

  python reproduce/prepare_fineweb.py --source hub --subset sample-10BT --out data/fineweb10B
  python reproduce/prepare_fineweb.py --source local --path /data/fineweb/ --out data/fw --max-tokens 1e8

Re-running with the same --out resumes after the last finished shard.
"""

import sys

from prism.data.prepare import main

if __name__ == "__main__":
    sys.exit(main())
