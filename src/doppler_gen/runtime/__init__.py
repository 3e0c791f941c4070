"""The run side under validate, bench and tune: one way to open a device, one runner.

``session`` picks the adapter (refusing a CPU one where timings are asked for), opens the device
with the features the kernels need, and says which variants a device cannot run at all.
``runner`` compiles a variant's passes, prepares a case (or refuses it before any dispatch),
binds buffers by role, NaN-poisons outputs and scratch before every run, runs every pass in one
command buffer, times them, and judges the output against the family's reference.
"""
