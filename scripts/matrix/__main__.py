"""``python -m scripts.matrix {run,leg} ...``"""

from __future__ import annotations

import sys

from scripts.matrix.cli import main

if __name__ == "__main__":
    sys.exit(main())
