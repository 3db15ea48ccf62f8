"""`python -m localcluster` is the same command as `localcluster`."""

from localcluster.cli import main

if __name__ == "__main__":
    main()
