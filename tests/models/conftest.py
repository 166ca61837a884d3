"""tests/models imports its GGUF model maker (gguf_models.py) from this folder."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
