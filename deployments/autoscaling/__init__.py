"""Autoscaling: Serve's autoscaling policies on what replicas carry (autoscaling), forecast-based
replica counts with guard rails (scale_policy), forecasters (forecast), and measured capacity curves
(capacity, with capacity_tiny_cpu.yaml).
"""
