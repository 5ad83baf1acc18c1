"""Slurm-facing code: the client (Slurm's CLI JSON, one parser for every release), the
cessation signal (has an execution's every process stopped?), and the admin hooks
(Prolog, TaskProlog, Epilog)."""
