"""python -m tests.fuzz --programs 2000 --seed S [--devices CPU,LLVM,CL] [--modes default,noopt,random] [--minutes M]

Draws seeded random programs (tests/fuzz/programs.py), runs each forward (and, for about half, backward) on every
device under every opt mode, compares with torch in float64, and prints each failure shrunk to a standalone test.
Exits 1 when anything failed. Run it from the repository root."""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fuzz.programs import draw_program  # noqa: E402
from fuzz.runner import MODES, as_test, check, shrink  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 1_000_000)
    parser.add_argument("--devices", default="CPU")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--minutes", type=float, default=0.0, help="stop after this long (0: no limit)")
    parser.add_argument("--max-steps", type=int, default=5)
    args = parser.parse_args(argv)
    devices, modes = args.devices.split(","), args.modes.split(",")
    if bad := [m for m in modes if m not in MODES]:
        parser.error(f"unknown mode(s) {bad}: choose from {list(MODES)}")
    print(f"fuzz: seed {args.seed}, {args.programs} programs, devices {devices}, modes {modes}", flush=True)
    start, failures, runs, done = time.monotonic(), [], 0, 0
    for i in range(args.programs):
        if args.minutes and time.monotonic() - start > args.minutes * 60:
            break
        program = draw_program(args.seed + i, args.max_steps)
        grad = (args.seed + i) % 2 == 0
        for device in devices:
            for mode in modes:
                runs += 1
                if (failure := check(program, device, mode, grad)) is not None:
                    failure = shrink(failure)
                    failures.append(failure)
                    print(f"\nFAIL seed {program.seed} on {device} ({mode}, grad={grad}): {failure.message}")
                    print(as_test(failure) + "\n", flush=True)
        done += 1
        if done % 25 == 0:
            print(
                f"fuzz: {done} programs, {runs} runs, {len(failures)} failures, {time.monotonic() - start:.0f} s",
                flush=True,
            )
    print(
        f"fuzz: seed {args.seed}: {done} programs, {runs} runs, {len(failures)} failures in "
        f"{time.monotonic() - start:.0f} s"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
