"""Evaluation under controlled conditions: `sandman eval run|compare|report`.

``spec`` (the tasks), ``pins`` (images by digest), ``conditions`` (what a
task's sandbox gets and the checks that it got it), ``network`` (offline
tasks stay offline), ``attempt`` (one try in one fresh sandbox), ``decide``
(whose fault, retry or not), ``runner`` (the run), ``scoring``, ``results``,
``summary`` and ``compare``. docs/eval.md is the user's guide.
"""
