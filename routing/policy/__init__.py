"""The routing policy: which engine serves a request.

Contracts (request, load, decision, the Router ABC), the cost and the engines'
fitted rates it prices with, Baton's policy and router, spill between colocated
engines, catalogue residency, and the baseline routers benches compare against.
Pure: no I/O, ``now`` passed in.
"""
