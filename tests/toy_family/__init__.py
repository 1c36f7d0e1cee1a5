"""A fourth model family that lives entirely in the test tree: a folder and one registry line
(``VOXSTAGE_FAMILIES=tests.toy_family.descriptor``), served end to end by
tests/integration/test_toy_family.py.

It is a test double of a model, not of the serving path: the talker speaks each byte of the text as one
frame of two codes and ends after the last, and the codec turns each frame into a tone whose pitch is the
byte, continuous across chunks. Everything between (presets, loaders, engines, streams, Status, the
gateway's catalog and faces) is the code that serves the real families.
"""
