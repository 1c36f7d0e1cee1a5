"""The launcher above the stages: the ``voxstage`` command line (``cli``), one host's deployment as
supervised processes (``serve``) and the demo (``demo``). This is the composition root: it may import every
stage and the gateway; nothing below it (the floor ``voxstage``, the stages, the gateway) imports it.
"""
