"""Lets the SDK tests import their helpers (the TCP proxy) by name."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
