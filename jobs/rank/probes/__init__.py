"""Evidence collected inside a rank: index-map alignment, bucket offsets, state fingerprints."""
