"""Entry point: ``python -m pipeline.demo`` (see pipeline.demo.demo)."""

import sys

from pipeline.demo.demo import main

sys.exit(main())
