"""The modelled GPU: a vLLM executor whose forward pass sleeps a profiled time.

- `profile`: a GPU's step times for one model (pure), and the shipped profiles in `profiles/`;
- `sequences`: which tokens each step computes and what it samples (pure);
- `timed_executor`: the vLLM `Executor` that runs both under vLLM's own scheduler;
- `timed_store`: its KV connector, the store's part of a disaggregated hop with the transfer timed.
"""

EXECUTOR = "actors.sim.timed_executor.TimedExecutor"  # its qualified name, for `distributed_executor_backend`
CONNECTOR, CONNECTOR_MODULE = "TimedStoreConnector", "actors.sim.timed_store"  # for `kv_transfer_config`
