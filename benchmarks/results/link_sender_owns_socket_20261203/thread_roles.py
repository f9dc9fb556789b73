"""thread_roles.py FILE.txt.gz [N]: a py-spy raw profile (``--threads``, or ``--gil``) of one
link_throughput case summed per thread role: the channel's writer, credit, producer and read
threads, the worker's event loop, and raw TCP's phase apart; with each role's N heaviest last two
frames. Samples are at 250 Hz: the channel phase of 40,000 messages at 3,793 MB/s is 5.53 s, or
about 1,382 samples."""

import collections
import gzip
import sys


def role(stack: str) -> str:
    if "nodes.py" in stack:
        return "raw TCP (either end)"
    for key, name in (
        ("QueueLink", "receiver: credit writer"),
        ("_write_loop", "sender: writer"),
        ("_credit_loop", "sender: credit"),
        ("ChannelProducer", "sender: producer"),
        ("FrameReader", "receiver: read"),
        ("_ReadThread", "receiver: read"),
        ("ChannelCollector", "receiver: consumer"),
        ("QueueInbox.get", "receiver: consumer"),
        ("run_forever", "event loop"),
    ):
        if key in stack:
            return name
    return "other"


def main() -> None:
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4
    totals: collections.Counter[str] = collections.Counter()
    frames: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    with gzip.open(path, "rt") as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if "importlib" in stack:
                continue
            name = role(stack)
            totals[name] += int(count)
            frames[name][";".join(stack.split(";")[-2:])] += int(count)
    for name, n in totals.most_common():
        print(f"{n:6d}  {name}")
        for frame, k in frames[name].most_common(top):
            print(f"        {k:6d}  {frame}")


if __name__ == "__main__":
    main()
