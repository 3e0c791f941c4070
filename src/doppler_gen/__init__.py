"""doppler-gen: one Jinja template per attention kernel family, every variant generated,
compiled and checked against a float64 reference."""

__version__ = "0.1.0"
