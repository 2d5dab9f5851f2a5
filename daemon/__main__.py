from __future__ import annotations

import sys

from sandman.daemon.cli import main

sys.exit(main())
