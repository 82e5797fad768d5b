"""`baton bench chaos`: faults under steady traffic, counted as a user sees them.

outcomes (what each request ended as, and when goodput came back: pure),
traffic (the steady mixed load), faults (what is killed, and how it comes
back), swap (a catalogue's engine killed mid-swap), durable (the batch and
stored responses that must survive), chaos (the command: a stack, the faults
in turn, JSON and a timeline).
"""
