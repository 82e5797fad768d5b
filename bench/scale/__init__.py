"""`baton bench scale`: what Baton itself costs at GPU request rates, on simulated engines: the control
plane (scale_control), simulated engines on one clock (scale_fleet), open-loop load (scale_load),
agent sessions (scale_agentic) and trace replay (scale_trace).
"""
