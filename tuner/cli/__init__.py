"""The `tuner` command line: parse, call, print; maps TunerError to one line and an exit code. common holds
the typer app, consoles and shared options; each command module (ops, fleet, bench, ui, status_view)
imports only common; main defines the core commands and registers the others.

May import: anything of the tuner.
"""
