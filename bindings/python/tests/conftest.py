"""Shared fixtures: the device of a test (CPU always; CUDA when fp8amp sees a GPU, skipped otherwise)
and a fresh random generator per test, seeded from FP8AMP_TEST_SEED or the clock (printed, so that a
failure can be replayed); for the PyTorch tests, the torch device (`tdev`) and a torch.Generator
seeded from that generator (`gen`). torch is imported only by the tests that use those two (the
binding's own tests run without it)."""
import os
import time

import numpy as np
import pytest

import fp8amp

HAVE_CUDA = fp8amp.device_count("cuda") > 0


@pytest.fixture(params=["cpu", "cuda"])
def device(request):
    if request.param == "cuda" and not HAVE_CUDA:
        pytest.skip("no CUDA device")
    return request.param


@pytest.fixture
def ctx(device):
    with fp8amp.Context(device) as c:
        yield c


@pytest.fixture
def rng():
    seed = int(os.environ.get("FP8AMP_TEST_SEED", time.time_ns() % (2**63)))
    print("FP8AMP_TEST_SEED=%d" % seed)
    return np.random.default_rng(seed)


@pytest.fixture(params=["cpu", "cuda"])
def tdev(request):
    torch = pytest.importorskip("torch")
    if request.param == "cuda" and not (torch.cuda.is_available() and HAVE_CUDA):
        pytest.skip("no CUDA device for PyTorch")
    return torch.device(request.param)


@pytest.fixture
def gen(rng):
    torch = pytest.importorskip("torch")
    return torch.Generator().manual_seed(int(rng.integers(2**62)))
