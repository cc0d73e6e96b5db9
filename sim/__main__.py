"""`python -m sim` is the same command line as `plansim`."""
import sys

from plansim.cli import main

sys.exit(main())
