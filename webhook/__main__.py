from __future__ import annotations

import sys

from sandman.webhook.cli import main

sys.exit(main())
