"""One completion request's path through a front, as stages.

`flow.py` reads top to bottom: auth, admission, parse, model, route, prefill,
dispatch, finish. Each stage is its own module; optional features (other
sites, a model catalogue, KV-aware routing) are strategies chosen once when
the front is built, not checks on the way. `request.py` holds what one
request carries between stages and builds the engine's body in one place;
`finish.py` is the one place its permit is released.
"""
