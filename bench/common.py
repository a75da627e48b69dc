"""Shared pieces of the benchmarks: process-tree memory sampling from /proc, machine facts,
topic helpers and the order-event generator.

Memory is sampled from /proc (no psutil dependency): a thread polls the RSS of the driver
process and of every descendant (the Spark JVM and its Python workers), excluding the embedded
broker, and keeps per-phase peaks. RSS of forked Python workers double-counts the pages they share
with the pyspark daemon; the proportional set size (PSS, /proc/PID/smaps_rollup) does not, so the
tree is reported both ways.

Over 500 lines on purpose: every benchmark (k2k, sql2k, replication, micro) imports its helpers
from this one module, so a figure is always measured the same way.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

MB = 1024 * 1024


# --------------------------------------------------------------------------- /proc sampling


def _status_kb(pid: int, fields: tuple[str, ...] = ("VmRSS",)) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                name, _, rest = line.partition(b":")
                key = name.decode()
                if key in fields:
                    out[key] = int(rest.split()[0])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return out


def rss_bytes(pid: int) -> int:
    return _status_kb(pid).get("VmRSS", 0) * 1024


def rss_and_anon_bytes(pid: int) -> tuple[int, int]:
    """The process's RSS and its own memory (RssAnon: without the file pages it maps, which the
    kernel can drop at any time; a memory-mapped file read counts in VmRSS while it stays mapped)."""
    kb = _status_kb(pid, ("VmRSS", "RssAnon"))
    return kb.get("VmRSS", 0) * 1024, kb.get("RssAnon", 0) * 1024


def hwm_bytes(pid: int | None = None) -> int:
    """Lifetime peak RSS (VmHWM) of a process."""
    return _status_kb(pid or os.getpid(), ("VmHWM",)).get("VmHWM", 0) * 1024


def reset_hwm(pid: int | None = None) -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to clear_refs). False when not permitted."""
    try:
        with open(f"/proc/{pid or os.getpid()}/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def pss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            for line in fh:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: split after the last ')'.
        ppid = int(stat[stat.rfind(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(name))
    return children


def descendants(root: int, exclude: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """Every process below `root`, skipping the subtrees of `exclude`."""
    children = _children_map()
    out: list[int] = []
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        if pid in exclude:
            continue
        out.append(pid)
        stack.extend(children.get(pid, []))
    return out


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, children: bool = True) -> float:
    """CPU time (user + system) of a process, plus that of its reaped children."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(b")") + 2 :].split()
    # fields[11..14] = utime, stime, cutime, cstime (stat fields 14..17)
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _CLK_TCK


def tree_cpu_seconds(root: int, exclude: set[int] | frozenset[int] = frozenset()) -> float:
    """CPU seconds of `root` and every live descendant (reaped ones are in their parent's cutime)."""
    return cpu_seconds(root) + sum(cpu_seconds(pid) for pid in descendants(root, exclude))


def tree_cpu_by_kind(root: int, exclude: set[int] | frozenset[int] = frozenset()) -> dict[str, float]:
    """CPU seconds (with reaped children) per kind of process: driver, jvm, python_worker, other."""
    out = {"driver": cpu_seconds(root), "jvm": 0.0, "python_worker": 0.0, "other": 0.0}
    for pid in descendants(root, exclude):
        out[_kind(pid)] += cpu_seconds(pid)
    return out


def loadavg() -> float:
    try:
        with open("/proc/loadavg") as fh:
            return float(fh.read().split()[0])
    except OSError:
        return -1.0


_KINDS: dict[int, str] = {}


def _kind(pid: int) -> str:
    kind = _KINDS.get(pid)
    if kind is None:
        kind, settled = _read_kind(pid)
        if settled:
            _KINDS[pid] = kind
    return kind


_LAUNCHERS = (b"bash", b"sh", b"dash", b"env")


def _read_kind(pid: int) -> tuple[str, bool]:
    """The process kind, and whether it is settled: the Spark JVM starts as a shell script
    (spark-submit, spark-class) that later execs java under the same pid, so a launcher is
    looked at again on the next sample instead of being remembered as what it is now."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ")
    except OSError:
        return "other", False
    program = cmd.split(b" ")[0]
    if b"java" in program:
        return "jvm", True
    settled = program.rsplit(b"/", 1)[-1] not in _LAUNCHERS
    # by the program's name: the embedded broker's binary lives under site-packages/python3.x
    if b"pyspark" in cmd or program.rsplit(b"/", 1)[-1].startswith(b"python"):
        return "python_worker", settled
    return "other", settled


@dataclass
class Peaks:
    """Peak memory in bytes seen during one phase."""

    driver_rss: int = 0  # the Python driver process (this process)
    jvm_rss: int = 0  # the Spark JVM (a child of the driver in local mode)
    workers_rss: int = 0  # Python workers and the pyspark daemon, summed
    workers_anon: int = 0  # the same without mapped file pages (RssAnon), summed
    tree_rss: int = 0  # driver + JVM + workers (+ any other child except the broker), summed
    tree_pss: int = 0  # the same tree by proportional set size (shared pages counted once)
    samples: int = 0
    # Filled when the phase ends: CPU seconds used by the tree and by the excluded processes
    # (the broker), wall seconds, and the 1-minute load average at the end (other work on the
    # machine inflates wall time, not CPU time).
    cpu_s: float = 0.0
    cpu_by_kind: dict[str, float] = field(default_factory=dict)
    other_cpu_s: float = 0.0
    sampler_cpu_s: float = 0.0  # excluded from driver CPU
    wall_s: float = 0.0
    load_end: float = 0.0

    def merge(self, other: Peaks) -> None:
        for name in ("driver_rss", "jvm_rss", "workers_rss", "workers_anon", "tree_rss", "tree_pss"):
            setattr(self, name, max(getattr(self, name), getattr(other, name)))
        self.samples += other.samples

    def as_mb(self) -> dict[str, float | int]:
        names = ("driver_rss", "jvm_rss", "workers_rss", "workers_anon", "tree_rss", "tree_pss")
        data: dict[str, float | int] = {k: round(getattr(self, k) / MB, 1) for k in names}
        data["samples"] = self.samples
        return data

    def cpu(self) -> dict[str, float]:
        return {
            "tree_cpu_s": round(self.cpu_s, 2),
            **{f"{k}_cpu_s": round(v, 2) for k, v in self.cpu_by_kind.items()},
            "broker_cpu_s": round(self.other_cpu_s, 2),
            "sampler_cpu_s": round(self.sampler_cpu_s, 2),
            "wall_s": round(self.wall_s, 2),
            "load_end": self.load_end,
        }


class TreeSampler:
    """Poll the driver's process tree every `interval_s` and keep per-phase peaks."""

    def __init__(
        self,
        root: int | None = None,
        exclude: set[int] | None = None,
        interval_s: float = 0.5,
        pss: bool = True,
        pss_every: int = 8,
    ):
        self.root = root or os.getpid()
        self.exclude = set(exclude or ())
        self.interval_s = interval_s
        self.pss = pss
        # PSS (smaps_rollup) is read for Python processes only and every `pss_every` samples: the
        # kernel walks every mapping for it, ~0.2 s for a Spark JVM on this machine. A JVM shares
        # next to nothing with other processes, so its RSS stands in for its PSS.
        self.pss_every = max(1, pss_every)
        self.phases: dict[str, Peaks] = {}
        self._current: Peaks | None = None
        self._cpu_seen: dict[int, tuple[str, float]] | None = None
        self._pids: list[int] | None = None
        self.sample_cpu_s = 0.0  # CPU the sampling itself used (subtracted from the driver's)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sample_cost_s = 0.0
        self.sample_count = 0

    def _descendants(self) -> list[int]:
        """Descendants, rescanned every `pss_every` samples (a /proc scan is ~20 ms on a busy
        machine); known pids that exited are dropped at once."""
        if self._pids is None or self.sample_count % self.pss_every == 0:
            self._pids = descendants(self.root, self.exclude)
        else:
            self._pids = [pid for pid in self._pids if os.path.exists(f"/proc/{pid}")]
        return self._pids

    def sample(self) -> Peaks:
        started = time.perf_counter()
        thread_cpu0 = time.thread_time()
        peaks = Peaks(samples=1)
        with_pss = self.pss and self.sample_count % self.pss_every == 0
        peaks.driver_rss = rss_bytes(self.root)
        tree_rss, tree_pss = peaks.driver_rss, pss_bytes(self.root) if with_pss else 0
        pids = self._descendants()
        cpu_now = self._cpu_snapshot(pids)
        with self._lock:
            if self._cpu_seen is not None:
                self._cpu_seen.update(cpu_now)
        for pid in pids:
            rss, anon = rss_and_anon_bytes(pid)
            kind = cpu_now[pid][0] if pid in cpu_now else _kind(pid)
            if kind == "jvm":
                peaks.jvm_rss += rss
            elif kind == "python_worker":
                peaks.workers_rss += rss
                peaks.workers_anon += anon
            tree_rss += rss
            if with_pss:
                tree_pss += rss if kind == "jvm" else pss_bytes(pid)
        peaks.tree_rss, peaks.tree_pss = tree_rss, tree_pss
        self.sample_cost_s += time.perf_counter() - started
        self.sample_cpu_s += time.thread_time() - thread_cpu0
        self.sample_count += 1
        return peaks

    def _cpu_snapshot(self, pids: list[int] | None = None) -> dict[int, tuple[str, float]]:
        """pid -> (kind, own CPU seconds) for the driver and its descendants (broker excluded).
        Own time only (no cutime): a Python worker that exits between two samples keeps the CPU
        it was last seen with, and its parent's reaped-children time is not counted twice."""
        if pids is None:
            pids = descendants(self.root, self.exclude)
        snap = {self.root: ("driver", cpu_seconds(self.root, children=False))}
        for pid in pids:
            snap[pid] = (_kind(pid), cpu_seconds(pid, children=False))
        return snap

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._record()

    def _record(self) -> None:
        sample = self.sample()
        with self._lock:
            if self._current is not None:
                self._current.merge(sample)

    def start(self) -> TreeSampler:
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @contextmanager
    def phase(self, name: str) -> Iterator[Peaks]:
        peaks = Peaks()
        cpu0 = self._cpu_snapshot()
        sampler_cpu0 = self.sample_cpu_s
        with self._lock:
            self._cpu_seen = dict(cpu0)
        other0 = sum(cpu_seconds(pid) for pid in self.exclude)
        wall0 = time.perf_counter()
        with self._lock:
            self._current = peaks
        self._record()
        try:
            yield peaks
        finally:
            self._record()
            with self._lock:
                self._current = None
            peaks.wall_s = time.perf_counter() - wall0
            with self._lock:
                seen, self._cpu_seen = self._cpu_seen or {}, None
            seen.update(self._cpu_snapshot())
            by_kind = {"driver": 0.0, "jvm": 0.0, "python_worker": 0.0, "other": 0.0}
            for pid, (kind, cpu) in seen.items():
                by_kind[kind] += max(0.0, cpu - cpu0.get(pid, (kind, 0.0))[1])
            by_kind["driver"] = max(0.0, by_kind["driver"] - (self.sample_cpu_s - sampler_cpu0))
            peaks.sampler_cpu_s = self.sample_cpu_s - sampler_cpu0
            peaks.cpu_by_kind = by_kind
            peaks.cpu_s = sum(by_kind.values())
            peaks.other_cpu_s = sum(cpu_seconds(pid) for pid in self.exclude) - other0
            peaks.load_end = loadavg()
            self.phases[name] = peaks

    def __enter__(self) -> TreeSampler:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# --------------------------------------------------------------------------- machine facts


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {"cores": os.cpu_count()}
    try:
        info["nproc"] = int(subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout)
    except (OSError, subprocess.CalledProcessError, ValueError):
        pass
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    info["memory_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info["python"] = platform.python_version()
    try:
        import confluent_kafka
        import pyarrow
        import pyspark

        info["pyspark"] = pyspark.__version__
        version, libversion = confluent_kafka.version(), confluent_kafka.libversion()
        info["confluent_kafka"] = version[0] if isinstance(version, tuple) else version
        info["librdkafka"] = libversion[0] if isinstance(libversion, tuple) else libversion
        info["pyarrow"] = pyarrow.__version__
    except ImportError:
        pass
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
        info["java"] = (java.stderr or java.stdout).splitlines()[0]
    except (OSError, IndexError):
        pass
    return info


# --------------------------------------------------------------------------- kafka helpers


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)


def topic_end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Verified high watermark per partition (the embedded broker may under-report ListOffsets)."""
    from dpone_dagster.kafka import inspect

    consumer = inspect.make_consumer({"bootstrap.servers": bootstrap}, "bench-inspect")
    try:
        partitions = inspect.topic_partitions(consumer, topic)
        return {p: wm.high - wm.low for p, wm in inspect.verified_watermarks(consumer, topic, partitions).items()}
    finally:
        consumer.close()


# The embedded broker (Tansu, memory storage) answers reads from a metadata cache whose entries live
# 5 s: under concurrent producers a stale entry can report a partition's end below records it had
# acknowledged until it expires. A count is final only past that.
BROKER_CACHE_S = 5.5


def topic_count(bootstrap: str, topic: str, timeout_s: float = 300.0, quiet_s: float = 1.0) -> int:
    """Records in the topic, counted by reading every partition from offset 0 to its end: what
    arrived, which offsets alone cannot show. Two ways the embedded broker under-reports are kept
    out: its earliest offset is the batch written first, not offset 0, when producers write a
    partition concurrently (so the read starts at 0, not at OFFSET_BEGINNING); and an end reported
    from its cache can be stale for `BROKER_CACHE_S` (so the count ends only once every partition
    reported its end, that long after the count began, with no record for `quiet_s`)."""
    from confluent_kafka import KafkaError, TopicPartition

    from dpone_dagster.kafka import inspect

    # The engine's driver-side consumer (partition EOF on), with full-size fetches for a whole read;
    # offset 0 gone by retention (a real cluster) starts at the earliest kept instead.
    consumer = inspect.make_consumer({"bootstrap.servers": bootstrap}, "bench-count", {"max.partition.fetch.bytes": 8_388_608, "auto.offset.reset": "earliest"})
    try:
        partitions = inspect.topic_partitions(consumer, topic)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        count, pending, ends = 0, set(partitions), dict.fromkeys(partitions, -1)
        started = time.monotonic()
        last_record = started
        while pending or time.monotonic() - started < BROKER_CACHE_S or time.monotonic() - last_record < quiet_s:
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"{topic}: partitions {sorted(pending)} not read to their end in {timeout_s:.0f}s")
            for message in consumer.consume(num_messages=10_000, timeout=0.2):
                err, partition = message.error(), message.partition()
                if err is None:
                    count += 1
                    last_record = time.monotonic()
                    if partition not in pending and message.offset() >= ends[partition]:  # past a reported end
                        print(f"topic_count: {topic}[{partition}] record at offset {message.offset()} past the end "
                              f"reported at {ends[partition]}", file=sys.stderr)
                        ends[partition] = sys.maxsize  # said once per partition
                elif err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(partition)
                    ends[partition] = max(ends[partition], message.offset())
                else:
                    raise RuntimeError(f"{topic}[{partition}]: {err}")
        return count
    finally:
        consumer.close()


# --------------------------------------------------------------------------- events

_STATUSES = ("created", "paid", "packed", "shipped", "delivered", "cancelled")
_CHANNELS = ("web", "app", "store", "partner")
_COUNTRIES = ("DE", "FR", "NL", "PL", "ES", "IT", "SE", "AT")
# One order event, ~200 bytes of compact JSON (the exact size is reported).
_TEMPLATE = (
    '{"order_id":%d,"customer_id":"c%07d","status":"%s","amount":%d.%02d,"currency":"EUR",'
    '"items":%d,"channel":"%s","country":"%s","created_at":"2026-11-01T%02d:%02d:%02d.%03dZ",'
    '"note":"order %d for customer %d via %s"}'
)


def order_event(i: int, order_id: int | None = None) -> bytes:
    oid = i if order_id is None else order_id
    return (
        _TEMPLATE
        % (
            oid,
            (i * 7919) % 10_000_000,
            _STATUSES[i % 6],
            (i * 37) % 5000,
            i % 100,
            1 + i % 9,
            _CHANNELS[i % 4],
            _COUNTRIES[i % 8],
            (i // 3_600_000) % 24,
            (i // 60_000) % 60,
            (i // 1000) % 60,
            i % 1000,
            oid,
            (i * 7919) % 10_000_000,
            _CHANNELS[i % 4],
        )
    ).encode()


@dataclass
class GenerateStats:
    messages: int
    partitions: int
    seconds: float
    bytes: int
    duplicate_ids: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def avg_bytes(self) -> float:
        return self.bytes / self.messages if self.messages else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "partitions": self.partitions,
            "seconds": round(self.seconds, 2),
            "msgs_per_s": round(self.messages / self.seconds) if self.seconds else None,
            "avg_value_bytes": round(self.avg_bytes, 1),
            "duplicate_order_ids": self.duplicate_ids,
        }


def generate_events(bootstrap: str, topic: str, messages: int, partitions: int, duplicate_every: int = 0) -> GenerateStats:
    """Produce `messages` order events round-robin over `partitions` as fast as one producer can.

    order_id is unique (= the event index) unless `duplicate_every` > 0: then every
    `duplicate_every`-th event repeats the order id of the event before it.
    """
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.num.messages": 10_000,
            "batch.size": 4_000_000,
            "compression.type": "none",
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "acks": 1,
        }
    )
    failed = [0]

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed[0] += 1

    started = time.perf_counter()
    total_bytes = 0
    duplicates = 0
    produce = producer.produce
    for i in range(messages):
        order_id = None
        if duplicate_every and i and i % duplicate_every == 0:
            order_id = i - 1
            duplicates += 1
        value = order_event(i, order_id)
        total_bytes += len(value)
        while True:
            try:
                produce(topic, value, partition=i % partitions, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(120)
    seconds = time.perf_counter() - started
    if remaining or failed[0]:
        raise RuntimeError(f"generating events: {failed[0]} failed, {remaining} undelivered")
    return GenerateStats(messages, partitions, seconds, total_bytes, duplicates)


def rate(messages: int, seconds: float) -> float:
    return round(messages / seconds, 1) if seconds > 0 else 0.0


def dump_json(data: Any) -> str:
    return json.dumps(data, indent=None, sort_keys=False, default=str)


def parse_settings(items: list[str]) -> dict[str, Any]:
    """KEY=VALUE command-line settings; a value that parses as JSON (numbers, booleans) is taken
    as such, anything else as text."""
    out: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out
