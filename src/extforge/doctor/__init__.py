"""`extforge doctor`: probe this machine and a Python environment, say what breaks CUDA extensions.

Each probe is a pure parser of a real output format (nvcc --version, nvidia-smi, the compiler's
predefined macros) plus a thin runner; the target Python is asked in a subprocess, so extforge
never imports torch. `diagnose` turns the facts into findings with the command that fixes each.

The entry point is doctor.diagnosis.run_doctor. This package module imports nothing, so the
light users of its parts (verify's driver probe, node admission) do not load the audit it runs.
"""
