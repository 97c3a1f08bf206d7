"""`python -m bench`: see bench/app.py; `--help` and a missing or unknown experiment are
answered by bench/cli.py before Hydra (and the experiments' imports) start."""

if __name__ == "__main__":  # ranks are spawned processes that re-import __main__
    import sys

    from bench.cli import intercept, normalize_argv

    intercept(sys.argv[1:])
    sys.argv[1:] = normalize_argv(sys.argv[1:])

    from bench.app import main

    main()
