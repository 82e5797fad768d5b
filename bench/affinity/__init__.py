"""`baton bench affinity`: where session-affinity routing pays, on the real stack (affinity), and its plot."""
