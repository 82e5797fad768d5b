"""`baton bench router`: routing policies replayed on the Mooncake trace (routing/sim/), trace-driven."""
