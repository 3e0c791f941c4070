"""Allows `python -m doppler_gen`."""

from doppler_gen.cli import main

main()
