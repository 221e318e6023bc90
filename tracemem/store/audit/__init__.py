"""Accountability: which runs and answers rest on what (sources, affected, suspect runs), people's
feedback and blame across answers, and retention that never drops the evidence kept runs cite."""
