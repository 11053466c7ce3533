"""Where the tests find external tools (helm, promtool, prometheus)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def find_binary(name: str) -> str | None:
    """$NAME (upper case), else beside this Python (./install.sh --dev puts helm, promtool
    and prometheus in .venv/bin), else PATH; None when absent."""
    beside_python = Path(sys.executable).parent / name
    for candidate in (os.environ.get(name.upper()), str(beside_python), shutil.which(name)):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None
