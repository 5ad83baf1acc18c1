"""Slurm-facing code: the client (client.py, the one face; one dialect per release family
in dialects.py, chosen once from the version; facts.py the parsed facts, the same on every
release; command.py the runner), the cessation signal (has an execution's every process
stopped?), the admin hooks (Prolog, TaskProlog, Epilog) and the site file's reader
(sitefile.py: contract/siteconf.py only parses it)."""
