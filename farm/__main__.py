"""`python -m farm` runs the CLI (the entry point for `ray job submit`)."""
import sys

from farm.cli import main

sys.exit(main())
