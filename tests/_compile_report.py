"""Summarise a compile log written with GKL_TEST_COMPILE_LOG=FILE (tests/conftest.py): seconds of tracing, lowering
and XLA compilation by program and by test file, and the programs compiled most often.

    GKL_TEST_COMPILE_LOG=/tmp/compile.tsv python -m pytest tests
    python tests/_compile_report.py /tmp/compile.tsv [--top 30]
"""

import argparse
import collections


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    by_event = collections.Counter()
    by_program = collections.defaultdict(lambda: [0.0, 0])
    by_file = collections.Counter()
    with open(args.log) as fh:
        for line in fh:
            test, event, program, seconds = line.rstrip("\n").split("\t")
            seconds = float(seconds)
            by_event[event] += seconds
            if event == "backend_compile_duration":
                by_program[program][0] += seconds
                by_program[program][1] += 1
                by_file[test.split("::")[0]] += seconds
    print("seconds by event:")
    for event, seconds in by_event.most_common():
        print(f"  {event:40s} {seconds:8.1f}")
    print(f"\nXLA compilation by program (top {args.top}): seconds, compilations")
    for program, (seconds, count) in sorted(by_program.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"  {program[:60]:60s} {seconds:8.1f} {count:5d}")
    print("\nXLA compilation by test file:")
    for name, seconds in by_file.most_common():
        print(f"  {name:40s} {seconds:8.1f}")


if __name__ == "__main__":
    main()
