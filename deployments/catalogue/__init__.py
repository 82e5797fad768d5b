"""A model catalogue on one replica: which models are resident and waking them (model_host), each
model's engine in its own Ray actor (model_actor) and runtime_env (runtime_envs), and which replica
runs a catalogue request (model_routing).
"""
