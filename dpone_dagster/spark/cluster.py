"""Ship the Python side of the engine to Spark executors that do not share the driver's venv.

Executors run the mapInArrow functions of the reader, the decoders and the writer, so they need
Python with pyarrow, confluent-kafka, fastavro and this package. Two ways to get them there:

- `pack_venv`: a tar.gz of a virtual environment for `spark.archives` (YARN, Kubernetes,
  standalone without a shared venv), used with `PYSPARK_PYTHON=./environment/bin/python`.
  Like venv-pack it does not copy the interpreter: `bin/python` stays a symlink to the base
  Python, which must exist at the same path on every executor (same image / OS / arch).
  `pyspark` and `py4j` are left out by default: executors import them from the cluster's
  `$SPARK_HOME/python/lib` (keep the driver's pyspark version equal to the cluster's Spark).
  An editable install (`pip install -e .`) only points at a source folder on this machine, so
  its hooks are dropped; pass the package folders in `packages` to copy them in instead.
- `zip_package`: a zip of the package for `spark.submit.pyFiles` / `--py-files`, when the
  executors already have the third-party libraries.

`executor_id` tells, inside a Python worker, which executor runs the task.

See docs/spark-cluster.md.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import tarfile
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

ENV_ALIAS = "environment"
DEFAULT_EXCLUDE = ("pyspark", "py4j")
_SKIP_DIRS = {"__pycache__"}
_LOG_URL_EXECUTOR = re.compile(r"[?&]executorId=([^&]+)")


def executor_id(environ: Mapping[str, str] | None = None) -> str:
    """`<host>:<executor id>` of the executor running the calling Python worker; `<host>:driver`
    in local mode. Python workers inherit the executor JVM's environment, which names the
    executor differently per cluster manager (Spark has no TaskContext attribute for it):

    - Kubernetes executor pods export SPARK_EXECUTOR_ID;
    - standalone workers (and local-cluster) export SPARK_LOG_URL_STDERR ending in
      `executorId=<id>&logType=stderr`;
    - YARN runs each executor in its own container: CONTAINER_ID (not Spark's number, but
      one per executor).
    """
    env = os.environ if environ is None else environ
    executor = env.get("SPARK_EXECUTOR_ID")
    if not executor:
        match = _LOG_URL_EXECUTOR.search(env.get("SPARK_LOG_URL_STDERR", ""))
        executor = match.group(1) if match else env.get("CONTAINER_ID")
    return f"{socket.gethostname()}:{executor or 'driver'}"


def package_dir() -> Path:
    """This package's source folder (what an editable install points at)."""
    return Path(__file__).resolve().parents[1]


def site_packages(venv: Path) -> Path:
    found = sorted(Path(venv).glob("lib/python3*/site-packages"))
    if len(found) != 1:
        raise ValueError(f"{venv}: expected one lib/python3*/site-packages, found {[str(p) for p in found]}")
    return found[0]


def _top_level_name(entry: str) -> str:
    """`pyspark-4.3.0.dist-info` -> `pyspark`, `py4j` -> `py4j`."""
    for suffix in (".dist-info", ".egg-info", ".data"):
        if entry.endswith(suffix):
            return entry[: -len(suffix)].split("-")[0].lower().replace("-", "_")
    return entry.lower()


def _excluded(entry: str, exclude: set[str]) -> bool:
    if entry.startswith("__editable__") or entry == "__pycache__":
        return True
    return _top_level_name(entry) in exclude


def pack_venv(
    venv: str | Path,
    out: str | Path,
    *,
    exclude: Iterable[str] = DEFAULT_EXCLUDE,
    packages: Iterable[str | Path] = (),
) -> Path:
    """Write `out` (tar.gz): pyvenv.cfg, bin/ (symlinks kept) and site-packages without the
    `exclude` distributions and editable-install hooks, plus a copy of each folder in `packages`
    under site-packages. Paths in the archive are relative to the venv root."""
    venv = Path(venv)
    if not (venv / "pyvenv.cfg").is_file():
        raise ValueError(f"{venv} is not a virtual environment (no pyvenv.cfg)")
    site = site_packages(venv)
    rel_site = site.relative_to(venv)
    skip = {name.lower().replace("-", "_") for name in exclude}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def no_cache(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if _SKIP_DIRS & set(Path(info.name).parts) else info

    with tarfile.open(out, "w:gz", compresslevel=1) as tar:
        tar.add(venv / "pyvenv.cfg", "pyvenv.cfg")
        tar.add(venv / "bin", "bin", filter=no_cache)
        for lib_entry in sorted((venv / "lib").iterdir()):
            if lib_entry.name != rel_site.parts[1]:
                tar.add(lib_entry, f"lib/{lib_entry.name}", filter=no_cache)
        tar.add(site, str(rel_site), recursive=False)
        for entry in sorted(site.iterdir()):
            if not _excluded(entry.name, skip):
                tar.add(entry, str(rel_site / entry.name), filter=no_cache)
        for package in packages:
            package = Path(package)
            tar.add(package, str(rel_site / package.name), filter=no_cache)
    return out


def zip_package(out: str | Path, package: str | Path | None = None) -> Path:
    """A zip of a package folder (default: this package) for `spark.submit.pyFiles`."""
    package = Path(package) if package else package_dir()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(package.rglob("*")):
            if path.is_file() and not _SKIP_DIRS & set(path.parts) and path.suffix != ".pyc":
                archive.write(path, str(Path(package.name) / path.relative_to(package)))
    return out


def archive_settings(archive_uri: str, alias: str = ENV_ALIAS) -> tuple[dict[str, str], dict[str, str]]:
    """(Spark conf, driver environment) that make executors run Python from a packed venv.

    The executors' Python is chosen by the driver's PYSPARK_PYTHON (a path relative to the
    executor's working directory, where Spark unpacks `spark.archives` under `alias`)."""
    return {"spark.archives": f"{archive_uri}#{alias}"}, {"PYSPARK_PYTHON": f"./{alias}/bin/python"}


def main(argv: list[str] | None = None) -> int:
    """`python -m dpone_dagster.spark.cluster pack-venv OUT [--venv DIR] [--with-package]`"""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dpone_dagster.spark.cluster")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack-venv", help="tar.gz of a venv for spark.archives")
    p.add_argument("out")
    p.add_argument("--venv", default=os.environ.get("VIRTUAL_ENV") or sys.prefix)
    p.add_argument("--with-package", action="store_true", help="copy dpone_dagster into the archive")
    p.add_argument("--keep", action="append", default=[], help="do not exclude this distribution (e.g. pyspark)")
    p = sub.add_parser("zip-package", help="zip of dpone_dagster for spark.submit.pyFiles")
    p.add_argument("out")
    args = parser.parse_args(argv)
    if args.command == "pack-venv":
        exclude = [name for name in DEFAULT_EXCLUDE if name not in args.keep]
        packages = [package_dir()] if args.with_package else []
        path = pack_venv(args.venv, args.out, exclude=exclude, packages=packages)
    else:
        path = zip_package(args.out)
    print(f"{path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
