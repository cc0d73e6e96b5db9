import sys

from plansim.cli import main

sys.exit(main())
