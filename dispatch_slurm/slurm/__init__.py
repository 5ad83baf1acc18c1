"""Slurm-facing code: the client (client.py, the one face; one dialect per release family
in dialects.py, chosen once from the version; facts.py the parsed facts, the same on every
release; command.py the runner), the cessation signal (has an execution's every process
stopped?), and the admin hooks (Prolog, TaskProlog, Epilog)."""
