"""``python -m scripts.measure {crossover,verify-record,analyze} ...``"""

from __future__ import annotations

import sys

from scripts.measure.cli import main

if __name__ == "__main__":
    sys.exit(main())
