"""The GPU image and the GPU evidence cannot drift apart (issue 29): the torch (and its CUDA) that runs the
GPU tests is at least the one the Dockerfile's base image pins. The Dockerfile's ``FROM`` line is the one
source of the pin; a GPU run on a torch older than the image's fails here, so the pin cannot move past the
torch the GPU numbers and tests came from without this test saying so on the next GPU run."""

from __future__ import annotations

import pytest
import torch
from packaging.version import Version

from tests.integration.deploykit import dockerfile_base

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_the_running_torch_is_not_older_than_the_image_pin() -> None:
    base = dockerfile_base()
    running = Version(torch.__version__.split("+")[0])
    assert running >= Version(base.torch), (
        f"torch {torch.__version__} runs the GPU tests, older than the image's {base.image}: update the GPU "
        "host's torch, or pin the Dockerfile to the torch the GPU evidence comes from"
    )
    assert torch.version.cuda is not None, f"torch {torch.__version__} is not a CUDA build"
    assert Version(torch.version.cuda) >= Version(base.cuda), (
        f"torch {torch.__version__} is built for CUDA {torch.version.cuda}, older than {base.image}'s"
    )
