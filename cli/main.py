"""The `baton` command: up, down, status, keys, secrets, model and bench."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from common.config import ConfigError, load_config
from common.processes import pid_alive


def _load(args):
    path = args.config or os.environ.get("BATON_CONFIG")
    cfg = load_config(path)
    return cfg, path or "<defaults>"


def cmd_up(args) -> int:
    from actors import engine_args
    from cluster.deploy import autoscaling_overrides
    from cluster.launcher import LocalStack, state_file
    from common import cpu_slice
    from deployments.sites import site_link

    cfg, source = _load(args)
    engine_args.validate(cfg, source)
    site_link.check(cfg, source)
    cpu_slice.check(cfg, source)
    # A bad `autoscaling` section fails here, before anything starts.
    autoscaling_overrides(cfg, None if source == "<defaults>" else source)
    existing = state_file(cfg)
    if existing.exists() and pid_alive(json.loads(existing.read_text())["pid"]):
        print(f"baton is already running (state in {existing}); run `baton down` first", file=sys.stderr)
        return 1
    stack = LocalStack(cfg, source)
    stop = {"now": False}

    def on_signal(signum, _frame):
        stop["now"] = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        stack.up()
        # ray.init installs its own SIGTERM handler; ours must win so that
        # everything `up` started is stopped in order.
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        url = f"http://{cfg.serve.host}:{cfg.serve.port}"
        mode = "colocated" if cfg.colocated else "disaggregated prefill/decode"
        print(f"\nBaton is ready at {url} ({mode}, model {cfg.model.served_name}). Ctrl-C stops it.")
        print(f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
              f"    -d '{{\"model\": \"{cfg.model.served_name}\", "
              f"\"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}], \"max_tokens\": 16}}'",
              flush=True)
        while not stop["now"]:
            time.sleep(1)
            if revived := stack.revive(time.monotonic()):
                print(f"restarted {', '.join(revived)} after it exited; see {stack.log_dir}", file=sys.stderr)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("\nstopping baton ...", flush=True)
        stack.down()
        print("stopped.", flush=True)
    return 0


def cmd_down(args) -> int:
    from cluster.launcher import state_file

    cfg, _ = _load(args)
    path = state_file(cfg)
    if not path.exists():
        print("baton is not running")
        return 0
    state = json.loads(path.read_text())
    pid = state["pid"]
    if pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
    for name, child in state.get("children", {}).items():
        if child and pid_alive(child):
            print(f"killing leftover {name} (pid {child})")
            os.kill(child, signal.SIGKILL)
    path.unlink(missing_ok=True)
    print("baton stopped")
    return 0


def cmd_status(args) -> int:
    from cluster import status

    cfg, _ = _load(args)
    report = status.collect(cfg)
    print(json.dumps(report, indent=2) if args.json else status.render(report))
    return 0 if report["healthy"] else 1


def cmd_model(args) -> int:
    from cluster import default_model
    from cluster.default_model import tiny_model

    cfg, _ = _load(args)
    if cfg.model.path is None:
        print(f"default model: {default_model.ensure_default()}", flush=True)
    elif not (cfg.model.resolved_path() / "config.json").exists():
        print(f"model.path {cfg.model.path}: no config.json there", file=sys.stderr)
        return 1
    if cfg.models:
        tiny_model.generate_catalogue(cfg.models, force=args.force)
    return 0


def cmd_keys(args) -> int:
    """API keys kept in Redis (deployments/api/api_keys.py); fronts see a change within a second or two."""
    from deployments.api import api_keys

    if args.action != "list" and not args.value:
        print(f"baton keys {args.action}: needs a {'tenant' if args.action == 'add' else 'key'}", file=sys.stderr)
        return 2
    if args.action == "hash":
        print(api_keys.hash_key(args.value))
        return 0
    cfg, _ = _load(args)
    client = cfg.redis.client(socket_timeout=5)
    if args.action == "add":
        print(api_keys.add(client, args.value))  # the only time the key is shown
        print(f"issued for tenant {args.value!r}; only its hash is stored", file=sys.stderr)
        return 0
    if args.action == "revoke":
        if api_keys.revoke(client, args.value):
            print("revoked", file=sys.stderr)
            return 0
        print("no such key (or the hash prefix matches several)", file=sys.stderr)
        return 1
    for digest, tenant in api_keys.listing(client):
        print(f"{digest}...  {tenant}")
    return 0


def cmd_secrets(args) -> int:
    from cluster import secrets

    for name, path in secrets.ensure(Path(args.dir)).items():
        print(f"{name}: {path}")
    return 0


BENCHES = ("serve", "ttft", "load", "affinity", "overload", "reject", "router", "kv", "models", "sites", "autoscale",
           "spec", "scale", "chaos")


def cmd_bench(args) -> int:
    from bench.affinity import affinity
    from bench.autoscale import autoscale
    from bench.chaos import chaos
    from bench.kv import kv
    from bench.load import load
    from bench.models import models
    from bench.overload import overload
    from bench.reject import reject
    from bench.router import router
    from bench.scale import scale
    from bench.serve import serve
    from bench.sites import sites
    from bench.spec import spec
    from bench.ttft import ttft

    modules = {"serve": serve, "ttft": ttft, "load": load, "affinity": affinity, "overload": overload,
               "reject": reject, "router": router, "kv": kv, "models": models, "sites": sites,
               "autoscale": autoscale, "spec": spec, "scale": scale, "chaos": chaos}
    interrupt_on_sigterm()
    return modules[args.what].main(args.extra)


def interrupt_on_sigterm() -> None:
    """Makes SIGTERM raise KeyboardInterrupt, as Ctrl-C does, so what a bench started (`vllm serve`,
    stacks) is stopped by its `with` and `finally` blocks rather than left running. Changes this
    process's SIGTERM handler."""

    def interrupt(_signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def cmd_deploy(args) -> int:
    from cluster import deploy

    return deploy.main((["--config", args.config] if args.config else []) + args.extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baton", description="PD-disaggregated LLM serving on Ray")
    parser.add_argument("--config", help="YAML config (default: $BATON_CONFIG or built-in defaults)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up", help="start the local stack and serve until Ctrl-C").set_defaults(fn=cmd_up)
    sub.add_parser("down", help="stop a stack started by `up`").set_defaults(fn=cmd_down)
    st = sub.add_parser("status", help="health of each component")
    st.add_argument("--json", action="store_true")
    st.set_defaults(fn=cmd_status)
    dp = sub.add_parser("deploy", add_help=False,
                        help="deploy the app onto a running Ray cluster (docs/deploy.md)")
    dp.set_defaults(fn=cmd_deploy)
    ks = sub.add_parser("keys", help="API keys: add TENANT | revoke KEY-OR-HASH | list | hash KEY")
    ks.add_argument("action", choices=["add", "revoke", "list", "hash"])
    ks.add_argument("value", nargs="?", default="")
    ks.set_defaults(fn=cmd_keys)
    se = sub.add_parser("secrets", help="make the Ray token and Redis password a `ray up` cluster needs")
    se.add_argument("--dir", default=str(Path("~/.baton/secrets")))
    se.set_defaults(fn=cmd_secrets)
    md = sub.add_parser("model", help="check (or train) the default model, generate the config's catalogue models")
    md.add_argument("--force", action="store_true", help="regenerate the catalogue models")
    md.set_defaults(fn=cmd_model)
    bench = sub.add_parser("bench", add_help=False, help="benchmarks: " + ", ".join(BENCHES))
    bench.add_argument("what", choices=list(BENCHES))
    bench.set_defaults(fn=cmd_bench)
    # deploy and bench pass their own options through to their modules.
    args, extra = parser.parse_known_args(argv)
    if extra and args.cmd not in ("deploy", "bench"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    try:
        return args.fn(args)
    except ConfigError as exc:
        print(f"baton: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
