from __future__ import annotations

import sys

from sandman.extender.cli import main

sys.exit(main())
