"""Declaring and running stage graphs: spec (nodes), pipeline (Pipeline beside Flow), program (the
compiled form), runner (executes a Program), fork, sinks, context, decide."""
