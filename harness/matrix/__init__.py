"""Level 6: configuration combinations (full or pairwise) and orthogonal gating."""
