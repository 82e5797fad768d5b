"""Baton's benchmarks: one subpackage per `baton bench` command (its module of the same name has
`main`, e.g. bench/serve/serve.py; `python -m bench.serve.serve` runs it too), shared helpers in
``common``, the P:D queueing model (``pd_model``, for notebooks/pd_ratio.ipynb) and the Mooncake
conversation trace (traces/).
"""
