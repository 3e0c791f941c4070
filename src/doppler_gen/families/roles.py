"""Binding roles: what the runtime does with each binding of a pass (no heavy imports here, so
``generate`` and ``check`` can name roles without loading numpy)."""

INPUT = "input"  # filled from the case
OUTPUT = "output"  # NaN-poisoned, read back and judged
SCRATCH = "scratch"  # intermediate between passes: sized by the template, NaN-poisoned
UNIFORM = "uniform"  # packed from the case's uniform values by field name
AUXILIARY = "auxiliary"  # a small input (lengths, page tables) that is not tensor traffic
ROLES = (INPUT, OUTPUT, SCRATCH, UNIFORM, AUXILIARY)
