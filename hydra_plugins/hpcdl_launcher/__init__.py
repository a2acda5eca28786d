"""hpcdl's Hydra launcher plugin (hydra/launcher=hpcdl)."""
