"""The collectives' benchmark (`main` of bench/ironlink_bench.py, the harness whose timers the other
bench programs use) under the name its JSON files carry, so `bench/run_py.sh allreduce` (what
bench/run.sh does) runs it like the other bench programs."""

from ironlink_bench import main

if __name__ == "__main__":
    main()
