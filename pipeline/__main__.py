"""Entry point: ``python -m pipeline --events FILE``."""

import sys

from pipeline.summary import main

sys.exit(main())
