"""Outputs in an object store (``--out s3://bucket/key.parquet``): the job works on a local copy
(its parts need atomic renames, which S3 lacks) and uploads the merged file at the end, with
pyarrow's own S3 filesystem (no extra dependency).

Credentials and endpoint come from the environment as for KServe's storage initializer:
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, and
``AWS_ENDPOINT_URL`` (or ``S3_ENDPOINT``) for a non-AWS store.

What holds for an object: the upload replaces it whole (a reader sees the old object or the
new one); the merged file it uploads is a complete run's, so it holds exactly that run's walk.
No lock guards a bucket: ``tsctl embed`` locks the local copy (``outputlock``), which keeps two
runs sharing one ``--work-dir`` apart, not two machines. Two writers of one key do not corrupt
it, but the last upload wins: give each writer its own key (the Indexed Job gives each shard
its own, and ``make kserve-lint`` checks it).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from serveclient.errors import ServeError

REMOTE_SCHEMES = ("s3://",)
WORK_DIR = Path(".tsctl-work")  # tsctl's default --work-dir: local copies of s3:// objects


def is_remote(out: str) -> bool:
    return str(out).startswith(REMOTE_SCHEMES)


def local_copy(uri: str, work_dir: Path) -> Path:
    """Where the job keeps ``uri``'s rows on this machine (stable per URI, so a restarted
    container with the same work folder resumes)."""
    name = uri.rstrip("/").rsplit("/", 1)[-1] or "out.parquet"
    digest = hashlib.sha256(uri.encode()).hexdigest()[:12]
    folder = Path(work_dir) / digest
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def _filesystem(uri: str):
    from pyarrow import fs

    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("S3_ENDPOINT")
    options = {}
    if endpoint:
        scheme, _, host = endpoint.rpartition("://")
        options = {"endpoint_override": host or endpoint, "scheme": scheme or "https"}
    region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION")
    if region:
        options["region"] = region
    return fs.S3FileSystem(**options), uri[len("s3://") :]


def download_if_exists(uri: str, local: Path) -> bool:
    """Fetch a previous output (a shard finished before the pod was replaced) so the run skips
    its rows; False when there is none."""
    from pyarrow import fs

    filesystem, key = _filesystem(uri)
    if filesystem.get_file_info(key).type != fs.FileType.File:
        return False
    if not local.exists():
        tmp = local.with_name(f".{local.name}.download.tmp")
        _copy(key, filesystem, str(tmp), fs.LocalFileSystem(), f"download {uri}", "then rerun")
        os.replace(tmp, local)
    return True


def upload(local: Path, uri: str) -> None:
    """Put the merged output at ``uri`` (a single PUT or multipart upload: readers see the
    old object or the new one); a failure says so, the merged rows kept in ``local``."""
    from pyarrow import fs

    filesystem, key = _filesystem(uri)
    kept = f"then rerun the same command with the same --work-dir: {local} keeps the rows"
    _copy(str(local), fs.LocalFileSystem(), key, filesystem, f"upload {local} to {uri}", kept)


def _copy(source: str, source_fs, dest: str, dest_fs, what: str, then: str) -> None:
    from pyarrow import fs

    try:
        fs.copy_files(source, dest, source_filesystem=source_fs, destination_filesystem=dest_fs)
    except OSError as exc:
        hint = f"check the store and its AWS_* settings, {then}"
        raise ServeError(f"cannot {what}: {exc}", hint) from exc


def parquet_objects(uri: str) -> list[tuple[str, int, int]]:
    """(URI, size, mtime in ns) of the object ``uri`` or, for a prefix (``s3://b/shards/``),
    of every ``.parquet`` directly under it, sorted: the shards an Indexed Job uploaded."""
    from pyarrow import fs

    filesystem, key = _filesystem(uri)
    info = filesystem.get_file_info(key.rstrip("/"))
    if info.type == fs.FileType.File:
        found = [info]
    else:
        selector = fs.FileSelector(key.rstrip("/"), allow_not_found=True)
        found = [i for i in filesystem.get_file_info(selector) if i.path.endswith(".parquet")]
    bucket = uri[len("s3://") :].split("/", 1)[0]
    return sorted(
        (f"s3://{bucket}/{i.path.split('/', 1)[1]}", i.size, i.mtime_ns)
        for i in found
        if i.type == fs.FileType.File
    )


def fetched(uri: str, size: int, mtime_ns: int, work_dir: Path) -> Path:
    """A local copy of the object ``uri`` (``size`` bytes, modified at ``mtime_ns``), reused
    while it matches; the copy carries the object's mtime, so its stat stamps the object."""
    from pyarrow import fs

    local = local_copy(uri, work_dir)
    if local.is_file() and (local.stat().st_size, local.stat().st_mtime_ns) == (size, mtime_ns):
        return local
    filesystem, key = _filesystem(uri)
    tmp = local.with_name(f".{local.name}.download.tmp")
    fs.copy_files(
        key, str(tmp), source_filesystem=filesystem, destination_filesystem=fs.LocalFileSystem()
    )
    os.utime(tmp, ns=(mtime_ns, mtime_ns))
    os.replace(tmp, local)
    return local


def stamp_of(uri: str) -> tuple[int, int] | None:
    """(size, mtime in ns) of the object ``uri`` now; None when it is gone."""
    from pyarrow import fs

    filesystem, key = _filesystem(uri)
    info = filesystem.get_file_info(key)
    return (info.size, info.mtime_ns) if info.type == fs.FileType.File else None
