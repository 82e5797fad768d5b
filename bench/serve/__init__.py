"""`baton bench serve`: Baton against `vllm serve` and Ray Serve LLM, same run (serve); also the
long-run drift (drift) and the core fence on and off (fence_ab).
"""
