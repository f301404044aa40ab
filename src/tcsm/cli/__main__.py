"""`python -m tcsm.cli ...` (what `torchrun -m tcsm.cli train ...` runs)."""

import sys

from tcsm.cli import main

sys.exit(main())
