"""The test bed: docker-slurm's driver (cluster.py), the overlap trials (trial.py and
their trainer, workload.py) and the one bounded poll (wait.py).

It lives beside the tests, in the source checkout, and is never part of the wheel:
users install the toolkit, the test bed builds clusters. ``python -m testbed trial``
(from tests/, or with tests/ on PYTHONPATH) runs the trials; ``make demo`` does."""
