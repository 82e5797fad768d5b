"""`baton bench load`: send a workload (bench.common.loadgen) to an OpenAI endpoint and measure it."""
