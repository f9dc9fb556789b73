"""prof_sum.py FILE [N]: py-spy raw (collapsed) stacks, per thread: samples, and the N heaviest
frames by self samples and by inclusive samples (the channel phase only: stacks of the raw TCP
case, comm_bench/nodes.py, are left out)."""

import collections
import re
import sys


def main() -> None:
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 12
    threads: collections.Counter[str] = collections.Counter()
    self_: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    incl: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    raw = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            n = int(count)
            if "nodes.py" in stack:
                raw += n
                continue
            frames = stack.split(";")
            thread = re.sub(r"0x[0-9a-f]+", "", re.sub(r"^thread \(\d+\): ", "", frames[0]))
            threads[thread] += n
            self_[thread][frames[-1]] += n
            for frame in set(frames[1:]):
                incl[thread][frame] += n
    print(f"{path}: raw-TCP-phase samples {raw}")
    for thread, n in threads.most_common(6):
        print(f"== {thread}: {n}")
        for frame, k in self_[thread].most_common(top):
            print(f"   self {k:6d} {frame}")
        for frame, k in incl[thread].most_common(top + 8):
            print(f"   incl {k:6d} {frame}")


if __name__ == "__main__":
    main()
