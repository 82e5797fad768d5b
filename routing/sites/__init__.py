"""Site selection: which site (region) serves a request.

The site selector and its baselines and named policies, backoff from refusing
sites, the probed latency map, and the Erlang C queueing formulas. Pure: no
clock, no I/O.
"""
