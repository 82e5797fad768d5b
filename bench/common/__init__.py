"""Helpers the benches share: a Baton stack in a child process (stack), the systems benches compare
against (peers, ray_serve_llm), load generation (loadgen, vllm_load), where a result goes (report),
and what a lent GPU machine needs (gpu_payload).
"""
