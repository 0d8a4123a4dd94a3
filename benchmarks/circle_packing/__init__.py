"""Circle packing: 26 circles in the unit square, maximise the sum of radii (the field's yardstick)."""
