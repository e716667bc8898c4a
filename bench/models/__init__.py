"""The model stacks that bench/e2e.py and bench/e2e_moe.py time: weights, one step's forward and
each contender's communication. The programs own the runs (heaps, phases, timing, checks)."""
