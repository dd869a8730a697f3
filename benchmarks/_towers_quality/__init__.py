"""The parts of ``benchmarks/towers_quality.py``, one concern per module.

``towers_quality.py`` stays the documented command and only calls :func:`cli.main`.
Imports go one way, from the command down:

* :mod:`~_towers_quality.cli`: options, the runs over datasets, seeds and variants, files.
* :mod:`~_towers_quality.report`: the tables and the figure.
* :mod:`~_towers_quality.variants`: the towered models compared with flat, and their towers.
* :mod:`~_towers_quality.training`: one model trained and scored.
* :mod:`~_towers_quality.datasets`: Frappe and MovieLens-1M, split, and their recipes.
* :mod:`~_towers_quality.stats`: paired intervals over seeds.
"""
