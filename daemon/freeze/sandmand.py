"""Entry script PyInstaller freezes into `sandmand` (runs as ``__main__``).

Kept outside the package (this folder has no ``__init__.py``) so that
collecting ``sandman.daemon``'s submodules never picks it up.
"""

from __future__ import annotations

import sys

from sandman.daemon.cli import main

if __name__ == "__main__":
    sys.exit(main())
