"""The collectives' benchmark (`python -m ironlink.bench`) under the name its JSON files carry,
so `bench/run_py.sh allreduce` (what bench/run.sh does) runs it like the other bench programs."""

from ironlink.bench import main

if __name__ == "__main__":
    main()
