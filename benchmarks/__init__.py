"""The benchmark scripts and the modules they share (runner: measuring; report: the
results files); see each script's docstring."""
