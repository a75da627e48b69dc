"""Test support: a spy on the real confluent-kafka clients of every Python process of a run.

A test puts this directory on PYTHONPATH and sets DPONE_TEST_CLIENT_SPY_DIR; Python imports this
module at start-up in the `dpone` process, in Spark's Python daemon and in every worker forked from
it (Spark passes PYTHONPATH on to them). It then writes JSON records into that directory:

- `process-*.json`: the process's pid, argv and environment, and its parent's command line and
  environment (for a Spark worker the parent is the JVM or the Python daemon): what a child inherited;
- `client-*.json`: the configuration dict each Producer / Consumer / AdminClient was created with,
  the process it was created in and, for producers, the topics it produced to.

The embedded broker speaks neither SASL nor TLS, so with DPONE_TEST_CLIENT_SPY_PLAINTEXT=1 the
client is created with the security settings (security.protocol, sasl.*, ssl.*) removed *after*
they were recorded: the run then works against it, and the record still shows what the project
passed to the client.
"""

from __future__ import annotations

import json
import os
import uuid

_DIR = os.environ.get("DPONE_TEST_CLIENT_SPY_DIR")


def _write(prefix: str, record: dict) -> str:
    path = os.path.join(_DIR, f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json")
    with open(path + ".tmp", "w") as out:
        json.dump(record, out, default=repr)
    os.replace(path + ".tmp", path)
    return path


def _read(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return handle.read().replace(b"\0", b"\n").decode("utf-8", "replace")
    except OSError as exc:
        return f"<unreadable: {exc}>"


def _install() -> None:
    import confluent_kafka
    import confluent_kafka.admin

    plaintext = os.environ.get("DPONE_TEST_CLIENT_SPY_PLAINTEXT") == "1"

    def record(kind: str, conf: dict) -> str:
        config = {str(k): v if isinstance(v, str | int | float | bool) else f"<{type(v).__name__}>" for k, v in conf.items()}
        return _write("client", {"kind": kind, "pid": os.getpid(), "argv": _read("/proc/self/cmdline"), "config": config, "topics": []})

    def effective(conf: dict) -> dict:
        if not plaintext:
            return conf
        dropped = ("security.protocol", "sasl.", "ssl.", "enable.sasl.", "enable.ssl.")
        return {k: v for k, v in conf.items() if not str(k).startswith(dropped)}

    def merged(args: tuple, kwargs: dict) -> tuple[dict, dict]:
        conf = dict(args[0]) if args and isinstance(args[0], dict) else {}
        settings = {k: v for k, v in kwargs.items() if k not in ("logger",)}
        return {**conf, **settings}, {k: v for k, v in kwargs.items() if k == "logger"}

    class Producer(confluent_kafka.Producer):
        def __init__(self, *args, **kwargs):
            conf, extra = merged(args, kwargs)
            self._spy_path = record("Producer", conf)
            self._spy_topics: set[str] = set()
            super().__init__(effective(conf), **extra)

        def produce(self, topic, *args, **kwargs):
            if topic not in self._spy_topics:
                self._spy_topics.add(topic)
                with open(self._spy_path) as handle:
                    data = json.load(handle)
                data["topics"] = sorted(self._spy_topics)
                with open(self._spy_path + ".tmp", "w") as out:
                    json.dump(data, out)
                os.replace(self._spy_path + ".tmp", self._spy_path)
            return super().produce(topic, *args, **kwargs)

    class Consumer(confluent_kafka.Consumer):
        def __init__(self, *args, **kwargs):
            conf, extra = merged(args, kwargs)
            record("Consumer", conf)
            super().__init__(effective(conf), **extra)

    # AdminClient is a Python class whose __init__ calls super(AdminClient, self) by its module-global
    # name: a subclass put under that name would recurse, so its __init__ is wrapped instead.
    admin_init = confluent_kafka.admin.AdminClient.__init__

    def spied_admin_init(self, *args, **kwargs):
        conf, extra = merged(args, kwargs)
        record("AdminClient", conf)
        admin_init(self, effective(conf), **extra)

    confluent_kafka.Producer = Producer
    confluent_kafka.Consumer = Consumer
    confluent_kafka.admin.AdminClient.__init__ = spied_admin_init


if _DIR:
    parent = os.getppid()
    _write(
        "process",
        {
            "pid": os.getpid(),
            "ppid": parent,
            "argv": _read("/proc/self/cmdline"),
            "environ": dict(os.environ),
            "parent_cmdline": _read(f"/proc/{parent}/cmdline"),
            "parent_environ": _read(f"/proc/{parent}/environ"),
        },
    )
    _install()
