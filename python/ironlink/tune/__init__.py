"""The decode tuner: `torchrun --nproc_per_node=N -m ironlink.tune` times ironlink.all_reduce's
paths and all_reduce_rmsnorm's modes on this node and writes the decode table of world N
(`ironlink.runtime.tuning.decode_table`) where the ops look first. `choose` turns timings into a table
(pure, tested on the CPU); `timing` is the graph timer; `__main__` measures on the GPUs."""
