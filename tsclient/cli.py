"""``tsctl``: operate a running TorchServe from the shell.

    tsctl list | describe NAME [VERSION] | health | metrics
    tsctl keys [--rotate inference|management|all] [--print inference|management]
    tsctl register ARCHIVE [--name N] [--batch-size B] [--max-batch-delay MS] [--workers W]
    tsctl scale NAME --min N [--max M] | set-default NAME VERSION | unregister NAME [VERSION]
    tsctl tag FILE... [--topk K] | embed FILE... [--out embeddings.npy]
    tsctl explain FILE [--model M] [--target T | --topk K] [--method M] [--n-steps N]
                 [--out heatmap.png]

Human-readable output by default, ``--json`` for scripts. Exit codes: 0 ok, 1 other server
error, 2 bad arguments (including names TorchServe cannot route), 3 server not running,
4 key file missing or key refused, 5 unknown model or version, 6 refused by the server
(registration outside the allowed sources, a name already registered, removing the default
version, an API switched off), 7 unhealthy (a model
without a READY worker, or some files failed in ``tag``/``embed``).
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from tsclient import errors, ports, promtext
from tsclient.client import TIMEOUT_S, TorchServeClient
from tsclient.keys import KEY_FILE, KINDS

RESTART_NOTE = ("not kept across a restart: `make serve` starts from config/ (--ncs); to keep "
                "it, put it in config/models/{name}.yaml and run `make config`")
ROTATE_MARGIN_S = 60.0  # `keys --print` hands out keys that live at least this long


class Progress:
    """A one-line progress bar on stderr (drawn only when stderr is a terminal)."""

    def __init__(self, total: int | None, label: str) -> None:
        self.total, self.label, self.done = total, label, 0
        self.start = time.monotonic()
        self.enabled = sys.stderr.isatty()
        self._lock = threading.Lock()

    def step(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            self._draw()

    def _draw(self) -> None:
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.start
        if self.total:
            filled = int(30 * self.done / self.total)
            bar = f"[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total}"
        else:
            bar = "waiting"
        sys.stderr.write(f"\r{self.label} {bar} {elapsed:5.1f}s")
        sys.stderr.flush()

    def wait(self, work: Callable[[], Any]) -> Any:
        """Run ``work`` while the bar shows the elapsed time."""
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(0.5):
                with self._lock:
                    self._draw()

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            return work()
        finally:
            stop.set()
            ticker.join()
            self.close()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


# ---------------------------------------------------------------------- commands
# Each returns (data for --json, text for humans, exit code).

def _version_rows(client: TorchServeClient) -> list[dict]:
    """One row per registered model version (``_version_row``)."""
    return [_version_row(entry) for model in client.list_models()
            for entry in client.describe(model["modelName"])]


def cmd_list(client: TorchServeClient, args) -> tuple[Any, str, int]:
    rows = _version_rows(client)
    text = _table(["model", "version", "default", "workers", "batch", "delay ms"],
                  [[r["model"], r["version"], "*" if r["default"] else "", r["workers"],
                    r["batchSize"], r["maxBatchDelay"]] for r in rows]) if rows else "no models"
    return rows, text, 0


def cmd_describe(client: TorchServeClient, args) -> tuple[Any, str, int]:
    entries = client.describe(args.name, args.version)
    # Only a single-version describe carries the handler's metadata (weights, top_k).
    custom = client.describe(args.name, args.version, customized=True)[0]
    lines = []
    for entry in entries:
        lines.append(_version_line(entry) + f", min/max workers {entry.get('minWorkers')}/"
                                            f"{entry.get('maxWorkers')}, archive "
                                            f"{entry.get('modelUrl')}")
        meta = custom.get("customizedMetadata")
        if entry.get("modelVersion") == custom.get("modelVersion") and isinstance(meta, dict):
            entry["customizedMetadata"] = meta
            weights = meta.get("weights", {})
            lines.append(f"  weights {weights.get('source')} (trained: {weights.get('trained')}), "
                         f"backend {meta.get('backend')}, top_k "
                         f"{meta.get('handler', {}).get('top_k')}")
            if isinstance(meta.get("precision_choice"), dict):
                lines.append(f"  precision {meta['precision_choice'].get('summary')}")
    return entries, "\n".join(lines), 0


def cmd_register(client: TorchServeClient, args) -> tuple[Any, str, int]:
    progress = Progress(None, f"registering {args.archive}")
    answer = progress.wait(lambda: client.register(
        args.archive, name=args.name, workers=args.workers, batch_size=args.batch_size,
        max_batch_delay=args.max_batch_delay))
    name = answer.get("model")
    described = client.describe(name) if name else []
    text = answer.get("status", "registered")
    for entry in described:
        text += "\n" + _version_line(entry)
    text += "\nnote: " + RESTART_NOTE.format(name=name or "NAME")
    return {"status": answer.get("status"), "model": name, "versions": described}, text, 0


def cmd_scale(client: TorchServeClient, args) -> tuple[Any, str, int]:
    progress = Progress(None, f"scaling {args.name}")
    answer = progress.wait(lambda: client.scale(args.name, args.min, args.max, args.version))
    return answer, (answer.get("status", "scaled") + "\nnote: "
                    + RESTART_NOTE.format(name=args.name)), 0


def cmd_set_default(client: TorchServeClient, args) -> tuple[Any, str, int]:
    answer = client.set_default(args.name, args.version)
    return answer, answer.get("status", "done"), 0


def cmd_unregister(client: TorchServeClient, args) -> tuple[Any, str, int]:
    answer = client.unregister(args.name, args.version)
    return answer, answer.get("status", "done"), 0


def cmd_health(client: TorchServeClient, args) -> tuple[Any, str, int]:
    ping = client.health()
    models = {f"{row['model']}/{row['version']}": row["ready"] for row in _version_rows(client)}
    unready = [m for m, ready in models.items() if ready == 0]
    healthy = ping.get("status") == "Healthy" and not unready
    lines = [f"server: {ping.get('status')}"]
    lines += [f"{m}: {ready} READY worker(s)" for m, ready in models.items()]
    if unready:
        lines.append(f"unhealthy: no READY worker for {', '.join(unready)} "
                     "(a worker may be restarting: retry in a few seconds, or `tsctl scale`)")
    return {"status": ping.get("status"), "ready_workers": models, "healthy": healthy}, \
        "\n".join(lines), 0 if healthy else errors.Unhealthy.exit_code


def cmd_keys(client: TorchServeClient, args) -> tuple[Any, str, int]:
    if args.rotate:
        for kind in KINDS if args.rotate == "all" else (args.rotate,):
            client.rotate(kind)
    keys = client.keys
    if args.print:
        if keys.expired(args.print, ROTATE_MARGIN_S):
            keys = client.rotate(args.print)
        return keys.key(args.print), keys.key(args.print), 0
    now = datetime.now(timezone.utc)
    data, lines = {}, [f"key file: {client.key_file.resolve() if client.key_file else '-'}"]
    for kind in KINDS:
        expires = keys.expires(kind)
        left = (expires - now).total_seconds() if expires else None
        data[kind] = {"expires": expires.isoformat() if expires else None,
                      "seconds_left": round(left) if left is not None else None,
                      "expired": left is not None and left <= 0}
        state = ("EXPIRED (tsctl rotates it on its next call; `tsctl keys --rotate "
                 f"{kind}` now)" if data[kind]["expired"] else f"{_duration(left)} left")
        lines.append(f"{kind}: expires {data[kind]['expires']} ({state})")
    lines.append("API key: never expires (rotates the other two)")
    if args.rotate:
        lines.insert(0, f"rotated: {args.rotate}")
    return data, "\n".join(lines), 0


def cmd_metrics(client: TorchServeClient, args) -> tuple[Any, str, int]:
    text = client.metrics_text()
    summary = promtext.summarise(text)
    statuses = promtext.frontend_statuses(text)
    lines = ["all requests by status: " + ", ".join(f"{k} {v}" for k, v in statuses.items())
             + " (including those refused before the handler: 503 queue full, 507 worker died)"]
    for model, m in summary.items():
        lines.append(f"{model}:")
        lines.append(f"  requests {m['requests']}, mean latency {m['mean_latency_ms']} ms")
        lines.append(f"  batches {m['batches']} holding {m['requests_in_batches']} requests, "
                     f"{m['images']} images; mean batch size {m['mean_batch_size']}")
        if m["batch_sizes"]:
            lines.append("  batch sizes: " + ", ".join(f"{size}x{count}" for size, count
                                                       in m["batch_sizes"].items()))
        lines.append("  errors: " + (", ".join(f"{k} {v}" for k, v in m["errors"].items())
                                     or "none"))
        lines.append(f"  decode {m['decode_ms_per_image']} ms/image, forward "
                     f"{m['forward_ms_per_batch']} ms/batch")
    return {"statuses": statuses, "models": summary}, "\n".join(lines), 0


def cmd_tag(client: TorchServeClient, args) -> tuple[Any, str, int]:
    results = _predict_files(client, args, args.model or "resnet50-tagger", topk=args.topk)
    lines = []
    for path, result in results.items():
        if isinstance(result, errors.TsError):
            lines.append(f"{path}: error: {result.message}")
        else:
            lines.append(f"{path}: " + ", ".join(f"{t['label']} {t['probability']:.3f}"
                                                 for t in result))
    data = {p: (r if not isinstance(r, errors.TsError) else {"error": r.message})
            for p, r in results.items()}
    return data, "\n".join(lines), _files_exit(results)


def cmd_embed(client: TorchServeClient, args) -> tuple[Any, str, int]:
    import numpy as np

    results = _predict_files(client, args, args.model or "resnet50-embedding")
    good = [p for p, r in results.items() if not isinstance(r, errors.TsError)]
    lines = [f"{p}: error: {r.message}" for p, r in results.items()
             if isinstance(r, errors.TsError)]
    data: dict[str, Any] = {"files": good,
                            "errors": {p: r.message for p, r in results.items()
                                       if isinstance(r, errors.TsError)}}
    if good:
        matrix = np.asarray([results[p]["embedding"] for p in good], dtype=np.float32)
        np.save(args.out, matrix)
        data |= {"out": str(args.out), "shape": list(matrix.shape)}
        lines.append(f"wrote {args.out}: {matrix.shape[0]} x {matrix.shape[1]} float32, rows in "
                     "the order of the files given" + (" that succeeded" if lines else ""))
    return data, "\n".join(lines), _files_exit(results)


def cmd_explain(client: TorchServeClient, args) -> tuple[Any, str, int]:
    path = Path(args.file)
    try:
        image = path.read_bytes()
    except OSError as exc:
        raise errors.UsageError(f"cannot read {path}: {exc.strerror}",
                                "check the file path") from None
    answer = client.explain(args.model, image, filename=path.name, target=args.target,
                            topk=args.topk, method=args.method, n_steps=args.n_steps,
                            png=args.out is not None)
    lines = [f"{path}: {answer['method']}"]
    for item in answer["explanations"]:
        lines.append(f"  {item['label']} (index {item['index']}, probability "
                     f"{item['probability']:.3f}): {len(item['grid'])}x{len(item['grid'][0])} "
                     "grid" + (", empty" if item.get("empty") else ""))
    if args.out is not None:
        args.out.write_bytes(base64.b64decode(answer["explanations"][0]["png"]))
        lines.append(f"wrote {args.out} (heatmap of the first target over the image)")
    data = {**answer, "explanations": [{k: v for k, v in e.items() if k != "png"}
                                       for e in answer["explanations"]]}
    return data, "\n".join(lines), 0


def _predict_files(client: TorchServeClient, args, model: str, **params) -> dict[str, Any]:
    """Send every file concurrently (``--concurrency``); each file's answer or its error, in
    the order given. A missing file is an error of that file, not of the run."""
    progress = Progress(len(args.files), model)
    results: dict[str, Any] = {path: None for path in args.files}

    def one(path: str) -> Any:
        try:
            image = Path(path).read_bytes()
        except OSError as exc:
            return errors.UsageError(f"cannot read {path}: {exc.strerror}")
        try:
            return client.predict(model, image, version=args.version, **params)
        except (errors.ServerNotRunning, errors.KeyFileError, errors.KeyRejected,
                errors.NotFound):
            raise  # the same for every file: stop and say so once
        except errors.TsError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        futures = {pool.submit(one, path): path for path in args.files}
        try:
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                progress.step()
        finally:
            progress.close()
            for future in futures:
                future.cancel()
    return results


def _files_exit(results: dict[str, Any]) -> int:
    failed = sum(isinstance(r, errors.TsError) for r in results.values())
    return errors.Unhealthy.exit_code if failed else 0


# ---------------------------------------------------------------------- helpers

def _version_row(entry: dict) -> dict:
    workers = entry.get("workers", [])
    return {"model": entry.get("modelName"), "version": entry.get("modelVersion"),
            "default": entry.get("default"), "workers": len(workers),
            "ready": sum(w.get("status") == "READY" for w in workers),
            "batchSize": entry.get("batchSize"), "maxBatchDelay": entry.get("maxBatchDelay")}


def _version_line(entry: dict) -> str:
    row = _version_row(entry)
    return (f"{row['model']} {row['version']}{' (default)' if row['default'] else ''}: "
            f"{row['workers']} workers, batch {row['batchSize']}, delay {row['maxBatchDelay']} ms")


def _table(header: list[str], rows: list[list]) -> str:
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
                     for row in cells)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown time"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


COMMANDS = {"list": cmd_list, "describe": cmd_describe, "register": cmd_register,
            "scale": cmd_scale, "set-default": cmd_set_default, "unregister": cmd_unregister,
            "tag": cmd_tag, "embed": cmd_embed, "health": cmd_health, "keys": cmd_keys,
            "metrics": cmd_metrics, "explain": cmd_explain}


def parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="tsctl", description=__doc__.splitlines()[0],
                                epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for api, default in (("inference", ports.INFERENCE_URL), ("management", ports.MANAGEMENT_URL),
                         ("metrics", ports.METRICS_URL)):
        p.add_argument(f"--{api}-url", default=env(f"TSCTL_{api.upper()}_URL", default),
                       help=f"default: {default} (or $TSCTL_{api.upper()}_URL)")
    p.add_argument("--key-file", default=env("TSCTL_KEY_FILE", KEY_FILE),
                   help=f"TorchServe's {KEY_FILE} (default: ./{KEY_FILE}, or $TSCTL_KEY_FILE)")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("--timeout", type=float, default=TIMEOUT_S,
                   help=f"seconds per call ({TIMEOUT_S:g})")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="registered models, versions and workers")
    d = sub.add_parser("describe", help="one model's versions, workers, settings, weights")
    d.add_argument("name")
    d.add_argument("version", nargs="?")
    r = sub.add_parser("register", help="register an archive from the model store and wait")
    r.add_argument("archive", help="file name in the model store (or a URL allowed by "
                                   "allowed_urls)")
    r.add_argument("--name", help="model name (default: the archive's)")
    r.add_argument("--batch-size", type=int)
    r.add_argument("--max-batch-delay", type=int, help="milliseconds")
    r.add_argument("--workers", type=int, help="exactly this many workers (default: the YAML's)")
    s = sub.add_parser("scale", help="set a model's worker count and wait")
    s.add_argument("name")
    s.add_argument("--min", type=int, required=True)
    s.add_argument("--max", type=int)
    s.add_argument("--version")
    sd = sub.add_parser("set-default", help="what /predictions/NAME serves")
    sd.add_argument("name")
    sd.add_argument("version")
    u = sub.add_parser("unregister", help="remove a model or one version")
    u.add_argument("name")
    u.add_argument("version", nargs="?")
    for command, default_model in (("tag", "resnet50-tagger"), ("embed", "resnet50-embedding")):
        c = sub.add_parser(command, help=f"send images to {default_model}, many at once")
        c.add_argument("files", nargs="+", metavar="FILE")
        c.add_argument("--model", help=f"default {default_model}")
        c.add_argument("--version")
        c.add_argument("--concurrency", type=int, default=8,
                       help="requests in flight (8; keep below job_queue_size)")
        if command == "tag":
            c.add_argument("--topk", type=int)
        else:
            c.add_argument("--out", type=Path, default=Path("embeddings.npy"))
    sub.add_parser("health", help="is the server up and every model READY")
    k = sub.add_parser("keys", help="key expiry; rotate keys")
    k.add_argument("--rotate", choices=[*KINDS, "all"])
    k.add_argument("--print", choices=KINDS,
                   help="print a valid key (rotated first when it expires within a minute), "
                        "e.g. KEY=$(tsctl keys --print inference)")
    sub.add_parser("metrics", help="batch sizes, requests, errors and latency per model")
    e = sub.add_parser("explain", help="where the model looked: a heatmap for one image")
    e.add_argument("file", metavar="FILE")
    e.add_argument("--model", default="resnet50-tagger")
    e.add_argument("--target", help="class index or label (default: the top-1 class)")
    e.add_argument("--topk", type=int, help="explain the k most probable classes")
    e.add_argument("--method", help="gradcam (default), ig or occlusion")
    e.add_argument("--n-steps", type=int, help="integrated-gradients steps")
    e.add_argument("--out", type=Path, help="write the heatmap PNG here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    client = TorchServeClient(args.inference_url, args.management_url, args.metrics_url,
                              key_file=args.key_file, timeout=args.timeout)
    try:
        data, text, code = COMMANDS[args.command](client, args)
    except errors.TsError as exc:
        if args.json:
            print(json.dumps({"error": exc.message, "hint": exc.hint,
                              "status": getattr(exc, "status", None)}))
        print(f"tsctl {args.command}: error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(data, indent=2) if args.json else text)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
