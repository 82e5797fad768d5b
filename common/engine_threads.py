"""How many OpenMP threads each CPU engine of a one-machine stack gets.

vLLM's CPU backend binds every engine's compute threads to the cores of its
NUMA node, less the cores it reserves for its own processes: one per engine,
two when the engine has a KV connector. It binds each engine as though it
had the machine to itself. With several engines on one machine (prefill and
decode, or routed colocated replicas) they then share the same cores: on 2
cores, two PD engines each ran 2 threads bound to cores 0 and 1, and two
connector-less colocated replicas both bound to core 0 and left core 1 idle.
An OpenMP parallel region waits for its slowest thread, so an engine whose
thread was preempted by the other engine's waits out a time slice.

`thread_env` splits the cores instead: each engine runs
`cores // engines` threads (at least one), unbound, and the kernel places
them. A single engine keeps vLLM's own binding. Measured with
`baton bench serve` on 2 cores (docs/bench_serve.md).
"""

from __future__ import annotations

# Settings of a pool's `env` that mean its owner chose the threads.
THREAD_KEYS = frozenset({"VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS"})


def thread_env(engines: int, cores: int) -> dict[str, str]:
    """Environment for each CPU engine when `engines` engines share `cores` cores; {} for one engine.

    Changes nothing; the launcher passes the result to the engines' processes.
    """
    if engines <= 1:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(max(1, cores // engines))}


def local_engines(colocated: bool, prefill_replicas: int, decode_replicas: int) -> int:
    """Engines a one-machine stack runs: the decode pool's, plus the prefill pool's when disaggregated."""
    return decode_replicas + (0 if colocated else prefill_replicas)
