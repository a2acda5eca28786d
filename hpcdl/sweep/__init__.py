"""Sweeps: Hydra multirun through hpcdl's launcher, as Slurm job arrays or a local background runner."""
