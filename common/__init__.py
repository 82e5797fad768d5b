"""The leaf every layer imports: the config (config/), constants, tracing, process and listener
helpers, CPU slicing, statistics, progress lines, and the `baton` response object."""
