"""`baton bench sites`: routing across sites under a hotspot, simulated (sites_sim, sites_geo,
sites_metrics) and on local sites joined by delaying proxies (sites_local, delay_proxy), and its plot.
"""
