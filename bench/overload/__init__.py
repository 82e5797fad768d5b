"""`baton bench overload`: goodput and per-tenant shares from 1x to 20x capacity (overload), and its plot."""
