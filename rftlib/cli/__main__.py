"""``python -m rftlib.cli ...`` (what torchrun's ranks and the launcher run): the same as ``rft ...``."""

import sys

from rftlib.cli import main

sys.exit(main())
