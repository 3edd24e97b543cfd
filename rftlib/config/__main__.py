"""``python -m rftlib.config [preset ...]``: the presets' derived schedules."""

import sys

from rftlib.config import schedule_table

print(schedule_table(sys.argv[1:] or None))
