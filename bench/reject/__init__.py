"""`baton bench reject`: what one refused request costs the front (reject), and what each way of
sharing permits across fronts would add to one admission (admission_paths).
"""
