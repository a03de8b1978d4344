"""The saved-bytes budget: bits per save by importance per byte (a pure planner), the noise
model, the keeper that re-encodes or pages out what does not fit, the measured sensitivity
of the parameters' gradients to each save, and the guard that keeps fragile saves exact."""
