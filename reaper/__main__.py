from __future__ import annotations

import sys

from sandman.reaper.cli import main

sys.exit(main())
