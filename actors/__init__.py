"""What runs inside an engine's process or next to it: the vLLM engine app a replica serves
(openai_app, engine_args, the plugin vLLM loads, heartbeats, the finisher that bills an answer),
KV save/load probes, speculation stats, and sim/, the timed executor that stands in for a GPU."""
