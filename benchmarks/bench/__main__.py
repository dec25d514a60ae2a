"""``python -m benchmarks.bench`` (from the repository's root): see :mod:`benchmarks.bench`."""

import sys

from benchmarks.bench.cli import main

sys.exit(main())
