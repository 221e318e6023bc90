"""The typed scope: paths, the scope model's description, tracked containers, the per-step
recorder and the view a stage receives."""
