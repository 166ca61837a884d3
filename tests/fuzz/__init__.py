"""The differential fuzzer of the compiler: random programs compared with torch in float64 (python -m tests.fuzz)."""
