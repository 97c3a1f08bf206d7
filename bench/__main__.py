"""`python -m bench`: see bench/app.py."""

if __name__ == "__main__":  # ranks are spawned processes that re-import __main__
    from bench.app import main

    main()
