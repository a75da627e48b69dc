"""Summarize CPU samples of a Java Flight Recorder file (JDK `jfr` tool): the hottest methods
(self time) and the hottest Spark/Jackson/Arrow frames anywhere on the stack (inclusive).

    python -m bench.jfr /tmp/rec.jfr [--top 30]
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys


def samples(path: str) -> list[list[str]]:
    out = subprocess.run(
        ["jfr", "print", "--json", "--stack-depth", "64", "--events", "jdk.ExecutionSample", path],
        capture_output=True,
        check=True,
    ).stdout
    events = json.loads(out)["recording"]["events"]
    stacks = []
    for e in events:
        frames = e["values"]["stackTrace"]["frames"] if e["values"].get("stackTrace") else []
        stacks.append([f"{f['method']['type']['name']}.{f['method']['name']}" for f in frames])
    return stacks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--match", action="append", default=[], help="count samples whose stack contains this text")
    args = p.parse_args(argv)
    stacks = samples(args.path)
    total = len(stacks) or 1
    self_counts = collections.Counter(s[0] for s in stacks if s)
    print(f"{len(stacks)} CPU samples")
    print("-- self")
    for name, n in self_counts.most_common(args.top):
        print(f"{100 * n / total:6.1f}%  {name}")
    print("-- inclusive (frames of interest)")
    inclusive: collections.Counter[str] = collections.Counter()
    keys = args.match or [
        "JsonToStructs", "StructsToJson", "JsonObjectKeys", "Jackson", "ArrowEvalPython", "ArrowWriter",
        "ArrowColumnVector", "ArrowConverters", "InMemoryRelation", "CachedBatch", "DefaultCachedBatchSerializer",
        "ColumnBuilder", "CompressibleColumn", "UnsafeExternalSorter", "ShuffleExternalSorter", "UnsafeShuffleWriter",
        "BypassMergeSortShuffleWriter", "SortExec", "WindowExec", "HashAggregate", "GeneratedClass", "codegen",
        "janino", "Janino", "CodeGenerator", "PythonRunner", "PythonArrowOutput", "BlockManager", "DiskStore",
        "MemoryStore", "LZ4", "lz4", "zstd", "Zstd", "Kryo", "JavaSerializer", "UTF8String", "GC",
    ]
    for stack in stacks:
        seen = set()
        for frame in stack:
            for key in keys:
                if key in frame and key not in seen:
                    seen.add(key)
        inclusive.update(seen)
    for name, n in inclusive.most_common():
        print(f"{100 * n / total:6.1f}%  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
