"""Benchmarks: real processes on loopback, measured against a baseline taken in the same run (DESIGN.md §7).

Each benchmark is a module run with ``python -m bench.<name>``; results go to ``bench/results/`` (git-ignored) as a
Markdown table and as JSON lines for comparing runs.
"""
