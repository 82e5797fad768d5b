"""`baton bench autoscale`: forecast-based autoscaling against the reactive policy, simulated
(autoscale_sim) and real (autoscale_real), with traces, metrics, oracle, plot, calibration and
capacity curves (capacity_curve).
"""
