"""`baton bench spec`: speculative decoding on and off on the copying model (spec; spec_gpu on a GPU), and its plot."""
