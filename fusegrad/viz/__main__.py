"""`python -m fusegrad.viz FILE [--port N]`: serve a saved VIZ recording (VIZ=1 prints where it saved one)."""

from __future__ import annotations
import argparse
import sys
from fusegrad.viz.server import load_recording, serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fusegrad.viz", description=__doc__)
    parser.add_argument("file", help="a recording (viz-*.json.gz under the cache dir's viz/)")
    parser.add_argument("--port", type=int, default=None, help="first port to try (default VIZ_PORT, 8000)")
    args = parser.parse_args(argv)
    try:
        recording = load_recording(args.file)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"python -m fusegrad.viz: {e}")
    serve(recording, args.port)


if __name__ == "__main__":
    main()
