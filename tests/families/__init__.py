"""Test-only kernel families: they prove a family is a plug-in the core knows nothing about."""
