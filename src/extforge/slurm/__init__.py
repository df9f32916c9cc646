"""Slurm: a recipe's variant matrix as jobs (`extforge build --slurm`), their state
(`extforge status`) and node verification on every node (`extforge verify --slurm`)."""
