"""`python -m verify ...`: the same as the `verify` command."""

from verify.cli import main

if __name__ == "__main__":
    main()
