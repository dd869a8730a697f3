"""The parts of ``benchmarks/headline.py``, the headline suite, one concern per module.

``headline.py`` stays the documented command (``python benchmarks/headline.py ...``) and
only calls :func:`_headline.cli.main`; the suite lives here so that each part reads, and
is tested, on its own. Imports go one way, from the command down:

* :mod:`~_headline.cli`: the command line: options, the rows, the estimates, the files.
* :mod:`~_headline.measure`: a model row measured: its pilot, its repeats, its summary.
* :mod:`~_headline.pilot`: the link rate, set by a pilot on the reference's exposed share.
* :mod:`~_headline.paired`: the rotated repeats and the shaped / unshaped pair of a run.
* :mod:`~_headline.runs`: one strategy's run on a fresh emulated cluster.
* :mod:`~_headline.workloads`: the model rows and the strategies each row runs.
* :mod:`~_headline.summary`: the statistics over repeats, each with its interval.
* :mod:`~_headline.estimates`: the cost model's estimates at scale.
* :mod:`~_headline.report`: the markdown report and its method text.
* :mod:`~_headline.tables`: its tables, ratios with intervals, verdicts.
* :mod:`~_headline.figure`: the step split into unshaped and exposed, measured.
* :mod:`~_headline.progress`: progress lines on stderr.

A script's own folder is on ``sys.path`` when it runs, so ``headline.py`` imports this
package as ``_headline``; loaded by path (the tests), it puts its folder there first.
"""
