"""Tools users run: demos, inspection, and later perf and chaos. Faces over the package."""
