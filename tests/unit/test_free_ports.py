"""Ports for servers that bind later: free now, and out of the way of outgoing connections."""

import socket

from common.processes import ephemeral_range, free_ports


def test_ports_are_distinct_free_and_below_the_ephemeral_range():
    low, _ = ephemeral_range()
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(20000 <= p < low for p in ports)  # no connect() takes these as local ports
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_port_in_use_is_never_handed_out():
    span = range(29000, 29020)
    held = []
    try:
        for p in span[:15]:  # hold most of a small range; what else holds a port there counts too
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", p))
                s.listen()
                held.append(s)
            except OSError:
                s.close()
        taken = {s.getsockname()[1] for s in held}
        got = free_ports(5, low=span[0], high=span[-1])
        assert len(set(got)) == 5 and not taken & set(got)
    finally:
        for s in held:
            s.close()
