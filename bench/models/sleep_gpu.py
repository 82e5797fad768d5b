"""The catalogue's sleep-mode swap on one GPU (issue 32), measured against a fresh `vllm serve`.

    python -m bench.models.sleep_gpu OUT_DIR [--level 1]

Runs deployments/catalogue/model_host.py's ModelHost in this process, without Ray or
the rest of the stack (the device machines lent to sessions have a GPU and
no network, so only vLLM and its Python dependencies travel there): two
generated models of the `gpu` size (cluster/default_model/tiny_model.py), room for one.
The sequence: model A starts (a fresh engine), B is asked for (A sleeps, B
starts), A again (B sleeps, A wakes), B again (A sleeps, B wakes). Each
step records the time to the first answer, the GPU memory in use
(nvidia-smi) and the greedy answer; a woken model must answer what it
answered before sleeping. Then the host stops and `vllm serve` of model A
starts fresh, timed from its start to its first answer, and its greedy
answer is compared too. Writes OUT_DIR/sleep_gpu.json as it goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BODY = {"prompt": "The quick brown fox", "max_tokens": 32, "temperature": 0, "ignore_eos": True}
ENGINE_ARGS = {"gpu_memory_utilization": 0.2, "attention_backend": "TRITON_ATTN",
               "compilation_config": {"custom_ops": ["none"]}}
SERVE_TIMEOUT_S = 300


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def gpu_used_mib() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True).stdout
    except FileNotFoundError:  # no GPU (a --cpu dry run)
        return -1
    return int(out.split()[0]) if out.strip() else -1


def models(root: Path, size: str) -> tuple[Path, Path]:
    from cluster.default_model.tiny_model import generate

    paths = []
    for name, seed in (("gpu-a", 21), ("gpu-b", 22)):
        t0 = time.monotonic()
        paths.append(generate(root / name, size=size, seed=seed))
        log(f"model {name} generated in {time.monotonic() - t0:.1f} s")
    return paths[0], paths[1]


def host_config(workdir: Path, a: Path, b: Path, level: int, engine_args: dict, dtype: str):
    import yaml

    from common.config import load_config

    weights_gb = sum(f.stat().st_size for f in a.glob("*.safetensors")) / 2**30
    text = yaml.safe_dump({
        "colocated": True,
        "model": {"path": str(a), "served_name": "gpu-a", "dtype": dtype},
        "decode": {"replicas": 1, "kv_cache_gb": 2.0, "engine_args": engine_args},
        "models": [{"id": "gpu-b", "path": str(b), "kv_cache_gb": 2.0}],
        # Every step waits for its model: the bench times wakes and starts, not the deadline's refusals.
        "admission": {"default_deadline_s": SERVE_TIMEOUT_S},
        # Room for one: each counts its float32 checkpoint plus 2 GiB of KV cache.
        "catalogue": {"memory_gb": round(1.5 * (weights_gb + 2.0), 2), "min_resident_s": 0,
                      "standby": False, "sleep_level": level},
    })
    path = workdir / "sleep_gpu.yaml"
    path.write_text(text)
    return load_config(path)


async def ask(host, model: str) -> tuple[float, str, int]:
    """One greedy completion through the host: (seconds, text, status)."""
    import httpx

    t0 = time.monotonic()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=host), base_url="http://baton",
                                 timeout=SERVE_TIMEOUT_S) as c:
        r = await c.post("/v1/completions", json={**BODY, "model": model}, headers={"x-baton-model": model})
    took = time.monotonic() - t0
    text = r.json()["choices"][0]["text"] if r.status_code == 200 else r.text
    return took, text, r.status_code


async def host_run(cfg, out: dict, save) -> None:
    from deployments.catalogue.model_host import ModelHost

    host = ModelHost(cfg, "gpu-replica")
    t0 = time.monotonic()
    await host.start()
    took, text, status = await ask(host, "gpu-a")
    out["steps"].append({"step": "start gpu-a", "to_first_answer_s": time.monotonic() - t0, "answer_s": took,
                         "status": status, "text": text, "gpu_used_mib": gpu_used_mib(),
                         "level": host.sleep_level})
    save()
    for model in ("gpu-b", "gpu-a", "gpu-b", "gpu-a"):
        asleep_before = model in host.asleep
        t0 = time.monotonic()
        took, text, status = await ask(host, model)
        step = {"step": ("wake " if asleep_before else "start ") + model, "to_first_answer_s": took,
                "status": status, "text": text, "gpu_used_mib": gpu_used_mib(),
                "asleep": sorted(host.asleep), "resident": sorted(host.engines),
                "wake_s": dict(host.wake_s), "resume_s": dict(host.resume_s)}
        out["steps"].append(step)
        log(f"{step['step']}: {took:.2f} s, status {status}, GPU {step['gpu_used_mib']} MiB")
        save()
    host.shutdown()
    await asyncio.sleep(2)
    out["gpu_used_after_shutdown_mib"] = gpu_used_mib()


def serve_run(cfg, out: dict, gpu: bool) -> None:
    """`vllm serve` of model A on the host's engine settings (bench/common/peers.py), fresh: seconds from its
    start to its first answer, and that answer."""
    import httpx

    from bench.models.models_wake import started_fast
    from bench.common.peers import VllmServe
    from common.config.models import catalogue_models, for_model

    server = VllmServe(for_model(cfg, catalogue_models(cfg)[0]), Path(out["serve_log"]), timeout_s=SERVE_TIMEOUT_S)
    if gpu:  # what ENGINE_ARGS gives the host's engines
        server.argv += ["--gpu-memory-utilization", str(ENGINE_ARGS["gpu_memory_utilization"]),
                        "--attention-backend", ENGINE_ARGS["attention_backend"],
                        "--compilation-config", json.dumps(ENGINE_ARGS["compilation_config"])]
    t0 = time.monotonic()
    try:
        with started_fast(server):
            r = httpx.post(f"{server.url}/v1/completions", json={**BODY, "model": "gpu-a"}, timeout=SERVE_TIMEOUT_S)
            r.raise_for_status()
            out["vllm_serve"] = {"to_first_answer_s": time.monotonic() - t0, "text": r.json()["choices"][0]["text"]}
    except (RuntimeError, httpx.HTTPError) as exc:
        out["vllm_serve"] = {"error": repr(exc)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--level", type=int, default=1)
    p.add_argument("--models", type=Path, default=Path("/tmp/baton-gpu-models"))
    p.add_argument("--cpu", action="store_true", help="a dry run of the sequence on CPU: tiny models, "
                   "float32, no GPU engine arguments (use --level 0: CPUs have no sleep mode)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    out: dict = {"level": args.level, "steps": [], "serve_log": str(args.out / "vllm_serve.log")}

    def save() -> None:
        (args.out / "sleep_gpu.json").write_text(json.dumps(out, indent=2))

    size, dtype = ("tiny", "float32") if args.cpu else ("gpu", "bfloat16")
    a, b = models(args.models, size)
    out["weights_bytes"] = sum(f.stat().st_size for f in a.glob("*.safetensors"))
    cfg = host_config(args.models, a, b, args.level, {} if args.cpu else ENGINE_ARGS, dtype)
    try:
        asyncio.run(host_run(cfg, out, save))
    except Exception as exc:  # noqa: BLE001 - the baseline still runs, and the error is recorded
        import traceback

        out["host_error"] = traceback.format_exc()
        log(f"host run failed: {exc!r}")
    save()
    serve_run(cfg, out, not args.cpu)
    texts = {s["text"] for s in out["steps"] if s["step"].endswith("gpu-a") and s["status"] == 200}
    out["gpu_a_answers_equal"] = len(texts) == 1 and out.get("vllm_serve", {}).get("text") in texts
    save()
    log(json.dumps({k: v for k, v in out.items() if k != "steps"}))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    sys.exit(main())
