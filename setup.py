"""Maps the card's physical folders onto the single ``voxstage`` import namespace.

``src/voxstage`` holds shared code; ``services/talker``, ``services/codec`` and ``gateway`` are imported as
``voxstage.talker``, ``voxstage.codec`` and ``voxstage.gateway``. Package lists are discovered so a new
subpackage needs no edit here.
"""

from setuptools import find_packages, setup

HOMES = {
    "voxstage": "src/voxstage",
    "voxstage.talker": "services/talker",
    "voxstage.codec": "services/codec",
    "voxstage.gateway": "gateway",
}


def _packages() -> list[str]:
    found: list[str] = []
    for name, folder in HOMES.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(folder)]
    return found


setup(packages=_packages(), package_dir=HOMES, package_data={"voxstage": ["py.typed", "presets/**/*"]})
