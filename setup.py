"""Package discovery: every import name is its folder.

``services/talker`` is ``services.talker``, ``services/codec`` is ``services.codec`` and ``gateway/`` is
``gateway`` (top-level packages of their own, found from the repository root); the one mapped folder is the
shared floor, ``src/voxstage``, imported as ``voxstage``. docs/architecture.md says why the folders are the
import names.
"""

from setuptools import find_packages, setup

STAGES = find_packages(include=["services", "services.*", "gateway", "gateway.*"])

setup(
    packages=[*STAGES, *find_packages("src")],
    package_dir={"voxstage": "src/voxstage"},
    package_data={"voxstage": ["py.typed", "presets/**/*"]},
)
