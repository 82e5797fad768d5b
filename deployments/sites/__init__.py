"""Across sites: one front's link to the other sites (site_link: probes, the latency map, forwarding).
The choice of site itself is pure and lives in routing/sites/.
"""
