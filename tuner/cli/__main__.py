"""`python -m tuner.cli ...`: the `tuner` command line."""

from tuner.cli.main import main

main()
