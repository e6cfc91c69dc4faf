"""The systems under test and the baselines, and how each one is started."""
