"""Cold-tier storage formats, shared by the templates and the numpy quantizer.

Kept free of heavy imports: the renderer exposes ``QUANT_BITS`` to every template as a global,
and ``quant`` packs data by the same table, so a format is declared exactly once.
"""

QUANT_BITS: dict[str, int] = {"int8": 8, "int4": 4}
"""Packed signed cold-tier formats by name (the host's ``mode``): bits per value."""
