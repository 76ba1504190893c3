"""What the operator reads: the spec as values (spec, placement) and what its watches saw
(observe, ownership)."""
