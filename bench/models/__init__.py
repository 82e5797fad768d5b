"""`baton bench models`: many models on one replica against one engine per model (models, models_stack,
models_wake, models_plot), and the GPU sleep-mode swap against a fresh `vllm serve` (sleep_gpu).
"""
