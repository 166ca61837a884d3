"""The backend-suite cases fusegrad does not run, each with its reason. conftest.py deselects them (a deselected
case is counted, not skipped, so CI's no-skip rule holds). Keys are regular expressions over the case name."""

EXCLUDED: dict[str, str] = {
    # real models that onnx downloads from the internet (CI has no network); the light copies run instead
}
