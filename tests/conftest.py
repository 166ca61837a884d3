"""The suite checks every kernel it compiles against the codegen spec (fusegrad/uop/spec.py) after each stage;
SPEC=0 in the environment turns the checks off. Subprocesses (examples, cache tests) inherit the setting."""

import os

os.environ.setdefault("SPEC", "1")

from fusegrad.helpers import SPEC  # noqa: E402

SPEC.value = int(os.environ["SPEC"])
