"""The differential fuzzer of the compiler: random programs compared against torch in float64 (`python -m tests.fuzz`)."""
